"""``status`` and ``logs``: what each rank of a deployment is doing, read live from its node."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from sparkfleet.config.secrets import env_file_secrets, redact
from sparkfleet.nodes import files as node_files
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.identity import when
from sparkfleet.nodes.runtime import runtime_for
from sparkfleet.nodes.runtime.base import RankState
from sparkfleet.nodes.transport import Connector, transport_for
from sparkfleet.nodes.transport.base import Stream, Transport
from sparkfleet.plan.model import RankHandle
from sparkfleet.state.deployments import Deployment


@dataclass(frozen=True)
class RankStatus:
    """One rank's live status."""

    rank: int
    node: str
    host: str
    runtime: str
    state: str
    uptime: float | None
    health: str
    detail: str = ""
    exited_at: float | None = None  # when an exited rank ended, where its runtime knows


def rank0_health(deployment: Deployment, timeout: float = 2.0) -> tuple[str, bool]:
    """Rank 0's health endpoint as ``status`` and ``watch`` show it ("healthy", "HTTP 503",
    "unreachable (…)"; "-" where the engine has none), and whether it is healthy."""
    head = deployment.ranks[0]
    path = head.readiness.health_path
    if not head.readiness.serves_http or not path:
        return "-", True
    # urllib, not httpx: one GET does not justify the 0.1-0.2 s httpx adds to `sparkfleet status`.
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(deployment.endpoint + path, timeout=timeout) as answer:
            code = answer.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except (OSError, ValueError) as exc:
        return f"unreachable ({type(exc).__name__})", False
    return ("healthy", True) if code == 200 else (f"HTTP {code}", False)


def current(deployment: Deployment, connect: Connector = transport_for) -> tuple[Deployment, list[RankStatus]]:
    """The record with its ranks as the nodes have them now; ``degraded`` where a rank of a ready
    deployment has died, whether or not ``watch`` saw it."""
    if deployment.unreadable:  # a record an older version wrote: say so, read no ranks from it
        return replace(deployment, status=f"{deployment.status} (record unreadable: {deployment.unreadable})"), []
    ranks = status(deployment, connect) if deployment.status != "stopped" else []
    if deployment.status == "ready" and any(r.state in ("exited", "absent") for r in ranks):
        deployment = replace(deployment, status="degraded")
    return deployment, ranks


def degraded_reason(deployment: Deployment, ranks: list[RankStatus]) -> str | None:
    """Why a degraded deployment cannot serve, in one line (None when it is not degraded)."""
    if deployment.status != "degraded":
        return None
    gone = [r for r in ranks if r.state in ("exited", "absent")]
    names = ", ".join(f"rank {r.rank} on {r.node}" for r in gone)
    if any(r.rank == 0 for r in gone):
        return f"{names} gone: rank 0 serves the endpoint, nothing answers"
    return (f"{names} gone: rank 0 cannot serve alone, it computes with every rank "
            f"(`sparkfleet restart {deployment.name}`, or `watch` with restart = \"on-failure\")")  # fmt: skip


def status(deployment: Deployment, connect: Connector = transport_for) -> list[RankStatus]:
    """Inspect every rank in parallel, and rank 0's health endpoint."""
    ranks = {str(r.rank): r for r in deployment.ranks}

    def inspect(key: str) -> RankState:
        rank = ranks[key]
        return runtime_for(rank).inspect(rank, connect(rank.node))

    outcomes = fan_out(list(ranks), inspect)
    head_health, _ = rank0_health(deployment)
    now = time.time()
    out = []
    for key, outcome in outcomes.items():
        rank = ranks[key]
        if outcome.error is not None:
            out.append(RankStatus(rank.rank, rank.node.name, rank.node.host, rank.runtime, "unknown", None, "-",
                                  str(outcome.error)))  # fmt: skip
            continue
        st = outcome.value
        assert st is not None
        uptime = now - st.started_at if st.started_at and st.state == "running" else None
        health = head_health if rank.rank == 0 else ("alive" if st.state == "running" else "-")
        out.append(RankStatus(rank.rank, rank.node.name, rank.node.host, rank.runtime, st.state, uptime, health,
                              exit_detail(st, deployment.ready_at), st.exited_at))  # fmt: skip
    return sorted(out, key=lambda s: s.rank)


def exit_detail(state: RankState, ready_at: float | None) -> str:
    """How an exited rank ended: its exit code (negative: the signal) and when, and whether that
    was after the deployment was ready."""
    if state.state != "exited":
        return ""
    code = (f"exit code {state.exit_code}" if state.exit_code is not None
            else "exit code unknown (its monitor is gone too)")  # fmt: skip
    if state.exited_at is None:
        return code
    after = f", {state.exited_at - ready_at:.0f}s after ready" if ready_at and state.exited_at >= ready_at else ""
    return f"{code} at {when(state.exited_at)}{after}"


def logs(deployment: Deployment, rank: int | None = None, tail: int | None = 200,
         connect: Connector = transport_for) -> dict[int, str]:  # fmt: skip
    """Every rank's recent log (or one rank's), fetched in parallel."""
    chosen = [r for r in deployment.ranks if rank is None or r.rank == rank]
    outcomes = fan_out([str(r.rank) for r in chosen], lambda k: _one_log(deployment, int(k), tail, connect))
    return {int(k): (o.value if o.ok and o.value is not None else f"(could not read: {o.error})")
            for k, o in outcomes.items()}  # fmt: skip


def rank_secrets(rank: RankHandle, transport: Transport) -> dict[str, str]:
    """The secret values the rank was started with, read back from its private env file: an
    engine that prints its own token must not show it through sparkfleet."""
    text = node_files.read_text(transport, rank.env_file)
    return env_file_secrets(text) if text is not None else {}


def _one_log(deployment: Deployment, rank: int, tail: int | None, connect: Connector) -> str:
    plan_rank = deployment.ranks[rank]
    transport = connect(plan_rank.node)
    text = runtime_for(plan_rank).logs(plan_rank, transport, tail=tail)
    return redact(text, rank_secrets(plan_rank, transport))


def follow(deployment: Deployment, emit: Callable[[int, str, str], None], rank: int | None = None,
           stop: threading.Event | None = None) -> None:  # fmt: skip
    """Stream every chosen rank's log lines to emit(rank, node, line) until stop is set."""
    stop = stop or threading.Event()
    streams: list[Stream] = []
    for r in (x for x in deployment.ranks if rank is None or x.rank == rank):
        transport = transport_for(r.node)
        secrets = rank_secrets(r, transport)
        stream = runtime_for(r).follow(r, transport)
        streams.append(stream)

        def pump(s: Stream = stream, rr: RankHandle = r, hidden: dict[str, str] = secrets) -> None:
            for line in s:
                emit(rr.rank, rr.node.name, redact(line, hidden))

        threading.Thread(target=pump, daemon=True).start()
    try:
        while not stop.is_set() and any(s.exit_code is None for s in streams):
            stop.wait(0.2)
    finally:
        for s in streams:
            s.close()
