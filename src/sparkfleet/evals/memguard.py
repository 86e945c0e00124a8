"""A memory guard for long prompts: watch MemAvailable on every node, abort below a floor.

On unified-memory machines (DGX Spark) the KV cache, activations and the page cache share one
pool; a long prefill can push a node into the OOM killer, which takes the whole deployment down.
The guard samples ``/proc/meminfo`` on every node over its Transport, keeps the low-water mark
per node, and when any node drops below the floor it aborts the server's requests once, the way
the engine's adapter says (``abort_route``, ``aborts_on_disconnect``):

- SGLang: ``POST /abort_request {"abort_all": true}`` (the route the seeds' memguard.py uses);
- vLLM, llama.cpp and others without an abort route: the client's connections are closed — vLLM
  aborts a request whose client disconnected; llama.cpp's server stops streaming requests on
  disconnect, but a non-streaming request may run to its end (said in the abort log).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from sparkfleet.errors import EvalError, SparkfleetError
from sparkfleet.nodes.facts import mem_available
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.engines import ENGINES, AbortRoute, engine_for

AbortAction = Callable[[], str]


def read_mem_available(transport: Transport) -> int:
    """MemAvailable of the node behind ``transport``, in bytes."""
    try:
        return mem_available(transport)
    except ValueError as exc:
        raise EvalError(f"{transport.node}: {exc}") from exc


def route_abort(base_url: str, route: AbortRoute, api_key: str | None = None) -> AbortAction:
    """An action that asks a server to abort every running request through its abort route."""

    def abort() -> str:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            response = httpx.post(
                f"{base_url.rstrip('/')}{route.path}", json=dict(route.body), headers=headers, timeout=10
            )
        except httpx.HTTPError as exc:
            return f"POST {base_url}{route.path} failed: {exc}"
        return f"POST {base_url}{route.path} -> HTTP {response.status_code}"

    return abort


def sglang_abort(base_url: str, api_key: str | None = None) -> AbortAction:
    """An action that asks an SGLang server to abort every running request."""
    route = engine_for("sglang").abort_route
    assert route is not None
    return route_abort(base_url, route, api_key)


def close_connections(client: httpx.Client, engine: str) -> AbortAction:
    """An action that closes the client's connections (an engine that aborts on disconnect
    stops the request; others may run a non-streaming request to its end)."""
    adapter = ENGINES.get(engine)
    aborts = adapter is not None and adapter.aborts_on_disconnect

    def abort() -> str:
        client.close()
        note = "" if aborts else " (a non-streaming request may still run to its end)"
        return f"closed the client's connections to the {engine} server{note}"

    return abort


def abort_action_for(engine: str, base_url: str, client: httpx.Client | None) -> AbortAction | None:
    """The abort action for an engine (a name the endpoint reported: maybe none sparkfleet
    plans); None when there is no route and no client to close."""
    adapter = ENGINES.get(engine)
    if adapter is not None and adapter.abort_route is not None:
        return route_abort(base_url, adapter.abort_route)
    if client is not None:
        return close_connections(client, engine)
    return None


@dataclass(frozen=True)
class GuardReport:
    """What the guard saw."""

    floor_bytes: int
    interval_s: float
    samples: int
    low_water: dict[str, int]
    tripped: bool
    tripped_node: str | None
    aborts: tuple[str, ...]
    errors: tuple[str, ...]

    def lines(self) -> list[str]:
        """Human-readable summary, one node per line."""
        gib = 1024**3
        out = [f"{node}: MemAvailable low-water {low / gib:.2f} GiB" for node, low in self.low_water.items()]
        if self.tripped:
            out.append(
                f"TRIPPED on {self.tripped_node} below {self.floor_bytes / gib:.2f} GiB: " + "; ".join(self.aborts)
            )
        out.extend(f"sampling error: {e}" for e in self.errors)
        return out


class MemGuard:
    """Samples every node in a background thread between ``start`` and ``stop`` (or a with-block)."""

    def __init__(
        self,
        transports: Sequence[Transport],
        floor_bytes: int,
        actions: Sequence[AbortAction] = (),
        interval_s: float = 1.0,
    ) -> None:
        if not transports:
            raise EvalError("the memory guard needs at least one node")
        self.transports = list(transports)
        self.floor_bytes = floor_bytes
        self.actions = list(actions)
        self.interval_s = interval_s
        self._low: dict[str, int] = {}
        self._samples = 0
        self._tripped_node: str | None = None
        self._aborts: list[str] = []
        self._errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.tripped = threading.Event()

    def sample_once(self) -> None:
        """Read every node once, update low-water marks, abort on the first breach."""
        for transport in self.transports:
            try:
                avail = read_mem_available(transport)
            except SparkfleetError as exc:
                if len(self._errors) < 20:
                    self._errors.append(str(exc))
                continue
            node = transport.node
            self._low[node] = min(avail, self._low.get(node, avail))
            if avail < self.floor_bytes and not self.tripped.is_set():
                self._tripped_node = node
                self.tripped.set()
                self._aborts = [action() for action in self.actions] or ["no abort action configured"]
        self._samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> MemGuard:
        """Take a first sample now (so a node already below the floor trips at once), then watch."""
        self.sample_once()
        self._thread = threading.Thread(target=self._loop, name="sparkfleet-memguard", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> GuardReport:
        """Stop watching and report."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=self.interval_s + 15)
        return self.report()

    def report(self) -> GuardReport:
        return GuardReport(
            floor_bytes=self.floor_bytes,
            interval_s=self.interval_s,
            samples=self._samples,
            low_water=dict(self._low),
            tripped=self.tripped.is_set(),
            tripped_node=self._tripped_node,
            aborts=tuple(self._aborts),
            errors=tuple(self._errors),
        )

    def __enter__(self) -> MemGuard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
