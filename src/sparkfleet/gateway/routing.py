"""Which replica serves a request: the routes' targets resolved against the state store, least
outstanding requests first, failed replicas out until a probe finds them answering again.

A replica is one engine endpoint (a deployment's rank 0, or a plain URL). The state store is
re-read every ``health_interval`` seconds, so ``up``, ``down`` and watch's restarts change the
routing without restarting the gateway; a replica's counters survive a re-read.

Changes without dropping requests (issue 34): a deployment in a passing status (``draining``,
``stopping``, ``starting``, ``degraded``) keeps its model's route, with no replica, so requests
for it wait (gateway/hold.py) rather than get 404; a drain (``drain()``, from the admin endpoint)
keeps new requests off one instance of a deployment while its in-flight ones finish, and may hold
its models' routes through a gap in the state store (down, then up, of a rollback).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sparkfleet.errors import GatewayError
from sparkfleet.gateway.config import GatewayConfig, Route, route_table

log = logging.getLogger("sparkfleet.gateway")

# A deployment in one of these is on its way back (or out): its model keeps a route, and requests
# for it wait for a ready replica instead of getting 404.
PASSING = ("draining", "stopping", "starting", "degraded")


@dataclass(frozen=True)
class Target:
    """A deployment as the state store records it (the columns the gateway reads)."""

    name: str
    endpoint: str
    served_model: str
    status: str
    route: str | None = None  # the recipe's [serve] route settings (JSON), from the stored Plan
    instance: str | None = None


def read_deployments(path: Path) -> list[Target]:
    """The deployments recorded in ``state.db`` (read-only: the gateway never writes there)."""
    if not path.exists():
        return []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(deployments)")}
            plan = "plan_json" if "plan_json" in columns else "NULL"  # a store older than stored Plans
            instance = "instance" if "instance" in columns else "NULL"
            rows = conn.execute(f"SELECT name, endpoint, served_model, status, {plan}, {instance} FROM deployments"
                                ).fetchall()  # fmt: skip
        finally:
            conn.close()
    except sqlite3.Error:
        return []  # no deployments table yet: nothing was ever brought up with this state dir
    return [Target(row[0], row[1], row[2], row[3], _route_settings(row[4]), row[5]) for row in rows]


def _route_settings(plan_json: str | None) -> str | None:
    if not plan_json:
        return None
    try:
        return json.loads(plan_json).get("serve", {}).get("gateway")
    except (ValueError, AttributeError):
        return None


def base_url(url: str) -> str:
    """An engine's root URL from an endpoint or a route's URL (with or without /v1)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


@dataclass(eq=False)
class Replica:
    name: str  # the deployment's name, or the URL
    base: str  # http://host:port
    upstream_model: str  # the model name this engine answers to
    outstanding: int = 0
    healthy: bool = True
    failures: int = 0
    last_error: str | None = None
    draining: bool = False
    present: bool = True  # still named by its route (a re-read may drop it; in-flight requests finish)
    instance: str | None = None  # the deployment's instance this replica is (None: a URL)


@dataclass
class RouteState:
    route: Route
    replicas: list[Replica] = field(default_factory=list)
    turn: int = 0  # where the next tie-break starts

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.healthy and not r.draining and r.present]


class Router:
    """The live routing table."""

    def __init__(self, config: GatewayConfig, state_db: Path) -> None:
        self.config = config
        self.state_db = state_db
        self.routes: dict[str, RouteState] = {}
        self._replicas: dict[tuple[str, str, str], Replica] = {}  # (route model, base, upstream model)
        self.refreshed = 0.0
        self.draining: set[tuple[str, str | None]] = set()  # (deployment, instance) drained
        self.held: dict[str, tuple[Route, float, str]] = {}  # model -> route, until (monotonic), deployment
        self.models_of: dict[str, set[str]] = {}  # deployment -> the routes it has served (kept: a drain needs
        # them while the deployment is away from the store)

    def refresh(self, deployments: Iterable[Target] | None = None) -> None:
        """Rebuild the table from the config and the state store's deployments."""
        deployments = list(read_deployments(self.state_db) if deployments is None else deployments)
        ready = [d for d in deployments if d.status == "ready"]
        by_name = {d.name: d for d in deployments}
        instances = {d.name: d.instance for d in ready}
        routes = list(self.config.routes)
        if not routes:  # no routes configured: every served model in the state store is one
            routes = self._from_recipes([d for d in deployments if d.status == "ready" or d.status in PASSING])
        now = time.monotonic()
        self.held = {m: held for m, held in self.held.items() if held[1] > now}
        routes += [held[0] for model, held in self.held.items() if model not in {r.model for r in routes}]
        table: dict[str, RouteState] = {}
        seen: set[tuple[str, str, str]] = set()
        for route in routes:
            found: list[tuple[str, str, str]] = []  # name, base, upstream model
            wanted = route.upstream_model or route.model
            for d in deployments:
                if (d.name in route.targets or (not route.targets and d.served_model == wanted)) and (
                        d.status == "ready" or d.status in PASSING):  # fmt: skip
                    self.models_of.setdefault(d.name, set()).add(route.model)
            if not route.targets:
                found += [(d.name, base_url(d.endpoint), d.served_model) for d in ready if d.served_model == wanted]
            for target in route.targets:
                if is_url(target):
                    found.append((target, base_url(target), wanted))
                elif target in by_name and by_name[target].status == "ready":
                    d = by_name[target]
                    found.append((d.name, base_url(d.endpoint), route.upstream_model or d.served_model))
            state = RouteState(route)
            for name, base, upstream in found:
                key = (route.model, base, upstream)
                replica = self._replicas.get(key)
                if replica is None:
                    replica = self._replicas[key] = Replica(name, base, upstream)
                if not replica.present or replica.instance != instances.get(name):
                    # Back in the state store as ready (up's smoke test passed): a new instance
                    # on the same endpoint, whatever the old one's failures were.
                    replica.healthy, replica.last_error = True, None
                replica.instance = instances.get(name)
                replica.draining = (name, replica.instance) in self.draining
                replica.present = True
                seen.add(key)
                state.replicas.append(replica)
            table[route.model] = state
        for key, replica in list(self._replicas.items()):
            if key not in seen:
                replica.present = False
                if replica.outstanding == 0:
                    del self._replicas[key]
        self.routes = table
        self.refreshed = time.monotonic()

    def _from_recipes(self, ready: list[Target]) -> list[Route]:
        """A route per served model, with what its deployment's recipe says in ``[serve]`` (the
        first deployment's, when several serve one model); a recipe whose settings do not parse
        gets the defaults and a warning, not a gateway that stops routing."""
        routes: dict[str, Route] = {}
        c = self.config
        for d in sorted(ready, key=lambda d: d.name):
            if d.served_model in routes:
                continue
            found = [c.default_route(d.served_model)]
            if d.route:
                try:
                    found = route_table(d.served_model, json.loads(d.route), f"deployment {d.name!r} [serve]",
                                        c.default_max_new_tokens, c.default_loop)  # fmt: skip
                except (ValueError, GatewayError) as exc:
                    log.warning("deployment %s: its [serve] route settings are ignored: %s", d.name, exc)
            for r in found:
                routes.setdefault(r.model, r)
        return list(routes.values())

    def drain(self, name: str, hold_for: float | None) -> list[Replica]:
        """Keep new requests off deployment name's current instance; its replicas (with the
        requests they have in flight). ``hold_for``: seconds its models' routes stay, with no
        replica, when the deployment leaves the state store (the gap of a down then up)."""
        replicas = [r for r in self._replicas.values() if r.name == name and r.present]
        for r in replicas:
            r.draining = True
            self.draining.add((name, r.instance))
        if hold_for:
            until = time.monotonic() + hold_for
            for model in self.models_of.get(name, ()):
                if model in self.routes:
                    self.held[model] = (self.routes[model].route, until, name)
        return replicas

    def undrain(self, name: str) -> set[str]:
        """The drain of name is over (its replacement is up, or the change failed); the models
        whose routes it held."""
        self.draining = {d for d in self.draining if d[0] != name}
        models = {m for m, held in self.held.items() if held[2] == name}
        for m in models:
            del self.held[m]
        return models

    def models(self) -> list[str]:
        return sorted(self.routes)

    def pick(self, model: str, exclude: set[int] | tuple[()] = ()) -> Replica | None:
        """The ready replica of model with the fewest requests in flight (None: none is ready);
        ties go round in turn, so an idle route spreads its requests too."""
        state = self.routes.get(model)
        if state is None:
            return None
        replicas = state.replicas
        n = len(replicas)
        state.turn += 1
        best: Replica | None = None
        for i in range(n):
            r = replicas[(state.turn + i) % n]
            if r.healthy and not r.draining and r.present and id(r) not in exclude and (
                    best is None or r.outstanding < best.outstanding):  # fmt: skip
                best = r
        return best

    def failed(self, replica: Replica, why: str) -> None:
        """Take a replica out until a probe finds it answering."""
        replica.healthy = False
        replica.failures += 1
        replica.last_error = why

    def unhealthy(self) -> list[Replica]:
        return [r for r in self._replicas.values() if not r.healthy and r.present]

    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())
