"""``status`` and ``logs``: what each rank of a deployment is doing, read live from its node."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
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
from sparkfleet.plan.engines.base import Readiness
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


def health_answer(status: int, body: str) -> tuple[bool, str]:
    """(healthy, the answer in a few words) for one HTTP answer of a health path: 200 is healthy;
    anything else is named with the server's own message when its body has one (llama-server:
    503 ``{"error": {"code": 503, "message": "Loading model", ...}}`` while it loads)."""
    if status == 200:
        return True, "HTTP 200"
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    err = obj.get("error", obj) if isinstance(obj, dict) else None
    found = (err.get("message") or err.get("detail")) if isinstance(err, dict) else err
    message = " ".join(found.split())[:80] if isinstance(found, str) else ""
    return False, f"HTTP {status}" + (f" {message}" if message else "")


def unreachable(exc: BaseException) -> str:
    """Why a server could not be asked, in a few words: refused, timed out, a name DNS does not
    know, or the error's type."""
    cause = exc.reason if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException) else exc
    named = ((ConnectionRefusedError, "connection refused"), (TimeoutError, "timed out"),
             (socket.gaierror, "DNS: name not resolved"), (ConnectionResetError, "connection reset"))  # fmt: skip
    return next((why for kind, why in named if isinstance(cause, kind)), type(cause).__name__)


def get_health(endpoint: str, readiness: Readiness, timeout: float = 5.0) -> tuple[bool, str]:
    """Rank 0's health, one GET of its health path: (healthy, "HTTP 200" / "HTTP 503 Loading model" /
    "connection refused" / …); (True, "-") where the engine has no health endpoint."""
    if not readiness.serves_http or not readiness.health_path:
        return True, "-"
    # urllib, not httpx: one GET does not justify the 0.1-0.2 s httpx adds to `sparkfleet status`.
    try:
        with urllib.request.urlopen(endpoint + readiness.health_path, timeout=timeout) as answer:
            return health_answer(answer.status, "")
    except urllib.error.HTTPError as exc:
        return health_answer(exc.code, exc.read(4096).decode(errors="replace"))
    except (OSError, ValueError) as exc:
        return False, unreachable(exc)


def rank0_health(deployment: Deployment, timeout: float = 2.0) -> tuple[str, bool]:
    """Rank 0's health as ``status`` and ``watch`` show it ("healthy", "HTTP 503 Loading model",
    "unreachable (connection refused)"; "-" where the engine has none), and whether it is healthy."""
    healthy, answer = get_health(deployment.endpoint, deployment.ranks[0].readiness, timeout)
    if healthy:
        return ("healthy" if answer != "-" else "-"), True
    return (answer if answer.startswith("HTTP") else f"unreachable ({answer})"), False


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
    outcomes = fan_out(list(ranks), lambda k: runtime_for(ranks[k]).inspect(ranks[k], connect(ranks[k].node)))
    head_health, _ = rank0_health(deployment)
    now = time.time()
    out = []
    for key, outcome in outcomes.items():
        rank, st = ranks[key], outcome.value
        where = (rank.rank, rank.node.name, rank.node.host, rank.runtime)
        if st is None:  # the node did not answer
            out.append(RankStatus(*where, "unknown", None, "-", str(outcome.error)))
            continue
        uptime = now - st.started_at if st.started_at and st.state == "running" else None
        health = head_health if rank.rank == 0 else ("alive" if st.state == "running" else "-")
        out.append(RankStatus(*where, st.state, uptime, health, exit_detail(st, deployment.ready_at), st.exited_at))
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
    chosen = {str(r.rank): r for r in deployment.ranks if rank is None or r.rank == rank}
    outcomes = fan_out(list(chosen), lambda k: rank_log(chosen[k], connect(chosen[k].node), tail))
    return {int(k): (o.value if o.ok and o.value is not None else f"(could not read: {o.error})")
            for k, o in outcomes.items()}  # fmt: skip


def rank_secrets(rank: RankHandle, transport: Transport) -> dict[str, str]:
    """The secret values the rank was started with, read back from its private env file: an
    engine that prints its own token must not show it through sparkfleet."""
    text = node_files.read_text(transport, rank.env_file)
    return env_file_secrets(text) if text is not None else {}


def rank_log(rank: RankHandle, transport: Transport, tail: int | None) -> str:
    """The rank's recent log, the secrets it was started with hidden."""
    return redact(runtime_for(rank).logs(rank, transport, tail=tail), rank_secrets(rank, transport))


def follow(deployment: Deployment, emit: Callable[[int, str, str], None], rank: int | None = None) -> None:
    """Stream every chosen rank's log lines to emit(rank, node, line) until every stream ends
    (or Ctrl-C)."""
    streams: list[Stream] = []
    for r in (x for x in deployment.ranks if rank is None or x.rank == rank):
        transport = transport_for(r.node)
        secrets, stream = rank_secrets(r, transport), runtime_for(r).follow(r, transport)
        streams.append(stream)

        def pump(s: Stream = stream, rr: RankHandle = r, hidden: dict[str, str] = secrets) -> None:
            for line in s:
                emit(rr.rank, rr.node.name, redact(line, hidden))

        threading.Thread(target=pump, daemon=True).start()
    try:
        while any(s.exit_code is None for s in streams):
            time.sleep(0.2)
    finally:
        for s in streams:
            s.close()
