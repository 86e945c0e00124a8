"""Is the deployment really serving? Liveness of every rank, rank 0's health, the boot-log
lines that must (and must not) appear, and a smoke completion with a checked answer."""

from __future__ import annotations

import functools
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from sparkfleet.apply.observe import get_health
from sparkfleet.config.secrets import ENGINE_KEY_ENV, auth_headers
from sparkfleet.errors import RankExited, ReadinessError
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.identity import Instance
from sparkfleet.nodes.runtime import port_holders
from sparkfleet.nodes.runtime.base import RankState, Runtime
from sparkfleet.nodes.transport.base import Transport, trace
from sparkfleet.plan.model import Plan, RankPlan

LOG_TAIL_LINES = 15
POLL_S = 0.5
FIRST_POLL_S = 0.05
LOG_POLL_S = 2.0


@dataclass
class BootLog:
    """What has been seen in the ranks' logs so far, and rank 0's health answers in order."""

    expected: dict[str, str | None] = field(default_factory=dict)  # pattern -> "node rank N" where seen
    # (seconds since the wait began, answer) each time it changed: "connection refused" → "HTTP 503 …"
    health: list[tuple[float, str]] = field(default_factory=list)

    def missing(self) -> list[str]:
        return [p for p, where in self.expected.items() if where is None]

    def saw_health(self, seconds: float, answer: str) -> None:
        if not self.health or self.health[-1][1] != answer:
            self.health.append((seconds, answer))

    def describe(self) -> str:
        """One line for the deployment's events: the health phases and where each line was seen."""
        phases = " → ".join(f"{answer} ({at:.1f}s)" for at, answer in self.health) or "not probed"
        lines = "; ".join(f"{p!r} on {where}" for p, where in self.expected.items() if where)
        return f"rank 0 health: {phases}" + (f"; boot-log lines: {lines}" if lines else "")


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log, indented for an error message."""
    return "\n".join("    " + line for line in text.rstrip().splitlines()[-lines:])


def check_logs(plan: Plan, logs: dict[int, str], boot: BootLog) -> None:
    """Raise on a forbidden line; note where each expected line appeared."""
    for r, text in logs.items():
        rank = plan.rank(r)
        for pattern in plan.verify.forbid:
            if match := re.search(pattern, text, re.MULTILINE):
                line = text[text.rfind("\n", 0, match.start()) + 1 : text.find("\n", match.end())]
                raise ReadinessError(f"rank {r} on {rank.node.name}: forbidden boot-log line {pattern!r} appeared:\n"
                                     f"    {line.strip()}\nlast log lines:\n{tail(text)}")  # fmt: skip
        for pattern, where in boot.expected.items():
            if where is None and re.search(pattern, text, re.MULTILINE):
                boot.expected[pattern] = f"{rank.node.name} rank {r}"


# A Python exception line, also behind an engine's log prefix ("(EngineCore pid=1) ERROR ... ").
_EXCEPTION = re.compile(r"^(?:.*\] |\s*)((?:\w+\.)*\w*(?:Error|Exception): .+)$")


def first_exception(log: str) -> str | None:
    """The first exception a log shows. Engines re-raise a worker's failure as a generic one
    ("Engine core initialization failed. See root cause above"): the cause is the first."""
    return next((m.group(1).strip() for line in log.splitlines() if (m := _EXCEPTION.match(line))), None)


def rank_exited(rank: RankPlan, state: RankState, log: str, reread: Callable[[], str] | None = None) -> RankExited:
    """The error for a rank that stopped during start-up, with its log's last lines; ``reread``
    reads its log again (see ``RankExited``): a log that reads empty then keeps the lines seen now."""
    code = f" with code {state.exit_code}" if state.exit_code is not None else ""
    what = "is gone" if state.state == "absent" else f"exited{code}"

    def message(text: str) -> str:
        shown, cause = tail(text), first_exception(text)
        first = f"\nfirst error in its log:\n    {cause}" if cause and cause not in shown else ""
        return f"rank {rank.rank} on {rank.node.name} {what} during start-up; last log lines:\n{shown}{first}"

    def redo() -> str:
        again = reread() if reread is not None else ""
        return message(again if again.strip() else log)

    return RankExited(message(log), redo)


def _tcp_ok(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


# Called with (node or None, rank or None, message) as up progresses.
Reporter = Callable[[str | None, int | None, str], None]


def await_worker_ports(plan: Plan, runtimes: dict[int, Runtime], transports: dict[str, Transport],
                       report: Reporter, within: float = 60.0) -> None:  # fmt: skip
    """Before the head starts (llama.cpp's rank 0 connects to its rpc-servers once, at start-up): until
    every worker with a TCP readiness port accepts a connection, or ``within`` seconds (then
    wait_ready names it). A worker that stopped meanwhile is named now, with its log."""
    waiting = [r for r in plan.ranks if r.rank != 0 and r.readiness.tcp_port]
    deadline = time.monotonic() + within
    while waiting and time.monotonic() < deadline:
        waiting = [r for r in waiting if not _tcp_ok(r.node.fabric_ip, r.readiness.tcp_port or 0)]
        for r in waiting:
            transport = transports[r.node.name]
            state = runtimes[r.rank].inspect(r.handle, transport)
            if state.state != "running":
                raise rank_exited(r, state, runtimes[r.rank].logs(r.handle, transport))
        if waiting:
            report(None, None, f"waiting for the ports of rank(s) {', '.join(str(r.rank) for r in waiting)}")
            time.sleep(0.2)


def check_answered_by(plan: Plan, transport: Transport, instance: Instance) -> None:
    """Raise unless the process listening on rank 0's port is the rank this up started: a
    health answer from another server (another deployment on the port) is no readiness."""
    head = plan.head
    holders = port_holders(transport, head.node.python, (plan.port,))
    known = [h for h in holders if h.pid is not None]
    if not known or any(h.instance == instance.id for h in known):
        return  # ours, or not visible to this user (then the port preflight is what holds)
    held = ", ".join(h.describe() for h in known)
    raise ReadinessError(f"{plan.name}: port {plan.port} on {head.node.name} answers, but it is held by {held} — not "
                         "rank 0 of this deployment, which cannot bind it")  # fmt: skip


def wait_ready(plan: Plan, transports: dict[str, Transport], runtimes: dict[int, Runtime], instance: Instance, *,
               timeout: float, on_progress: Callable[[str], None]) -> BootLog:  # fmt: skip
    """Poll until every rank lives, rank 0 is healthy and every expected line appeared."""
    boot = BootLog({p: None for p in plan.verify.expect})
    began, began_wall = time.monotonic(), time.time()
    pause, deadline, next_logs, healthy = FIRST_POLL_S, began + timeout, 0.0, False
    ports_seen: set[int] = set()
    ranks = {str(r.rank): r for r in plan.ranks}
    head_node = transports[plan.head.node.name]

    def look(with_logs: bool) -> None:
        """Every rank still runs (else raise with its log); with_logs: check the boot logs too."""

        def one(key: str) -> tuple[RankState, str | None]:
            rank = ranks[key]
            runtime, node = runtimes[rank.rank], transports[rank.node.name]
            return runtime.probe(rank.handle, node) if with_logs else (runtime.inspect(rank.handle, node), None)

        seen = fan_out(ranks, one).raise_first()
        for key, (state, log) in seen.items():
            if state.state != "running":
                rank = ranks[key]
                runtime, node = runtimes[rank.rank], transports[rank.node.name]
                log = runtime.logs(rank.handle, node) if log is None else log
                raise rank_exited(rank, state, log, functools.partial(runtime.logs, rank.handle, node))
        if with_logs:
            check_logs(plan, {int(k): log or "" for k, (_, log) in seen.items()}, boot)

    while True:
        now = time.monotonic()
        want_logs = now >= next_logs or healthy
        look(want_logs)
        if want_logs:
            next_logs = now + LOG_POLL_S
        head, was_healthy = plan.head, healthy
        healthy, answer = get_health(plan.endpoint, head.readiness)
        if answer != "-":
            boot.saw_health(time.monotonic() - began, answer)
            if healthy and not was_healthy:
                check_answered_by(plan, head_node, instance)
        # A worker's port is probed until it has answered once: llama.cpp's rpc-server serves one
        # client at a time, so once rank 0 holds its connection a probe would wait in its backlog.
        # Whether it is still alive after that is the rank's process state, which look() watches.
        ports_seen.update(
            r.rank for r in plan.ranks
            if r.readiness.tcp_port and r.rank not in ports_seen and _tcp_ok(r.node.fabric_ip, r.readiness.tcp_port)
        )  # fmt: skip
        workers_ok = all(r.rank in ports_seen for r in plan.ranks if r.readiness.tcp_port)
        missing = boot.missing()
        if healthy and workers_ok and not missing:
            # The logs once more, read after rank 0 answered: a forbidden line that a rank printed
            # while rank 0 came up (after this round's read) must not pass as ready.
            look(True)
            trace("phase", plan.head.node.name, began_wall, time.time(), "readiness")
            return boot
        waiting = f"rank 0 health ({answer})" if not healthy else ("worker ports" if not workers_ok else
                                                                   f"log lines {missing}")  # fmt: skip
        on_progress(f"waiting for {waiting}")
        if time.monotonic() > deadline:
            log = tail(runtimes[0].logs(head.handle, head_node))
            raise ReadinessError(f"{plan.name} not ready after {timeout:.0f}s: still waiting for {waiting}; "
                                 f"rank 0 on {head.node.name}, last log lines:\n{log}")  # fmt: skip
        # Short pauses first, then POLL_S: a rank that is ready at once is seen at once, and a
        # slow one is not probed more than twice a second.
        time.sleep(pause)
        pause = min(POLL_S, pause * 2)


def _served_model_id(endpoint: str, fallback: str, headers: dict[str, str]) -> str:
    """The model id the server answers to (its first /v1/models entry), else fallback."""
    try:
        data = httpx.get(f"{endpoint}/v1/models", timeout=10.0, headers=headers).json().get("data") or []
        return str(data[0]["id"]) if data else fallback
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return fallback


def smoke(plan: Plan) -> str:
    """Send the smoke prompt (greedy) and check the answer; returns the completion text."""
    verify, env = plan.verify, plan.head.env_dict()
    # A deployment started with an API key (the engine's own variable, e.g. VLLM_API_KEY) is smoke-tested with it.
    headers = auth_headers(next((env[k] for k in ENGINE_KEY_ENV if env.get(k)), None))
    model = _served_model_id(plan.endpoint, plan.served_model, headers)
    body = {"model": model, "prompt": verify.smoke_prompt, "max_tokens": verify.smoke_max_tokens,
            "temperature": 0}  # fmt: skip
    try:
        response = httpx.post(f"{plan.endpoint}/v1/completions", json=body, timeout=300.0, headers=headers)
    except httpx.HTTPError as exc:
        raise ReadinessError(f"smoke completion to {plan.endpoint} failed: {exc}") from exc
    if response.status_code != 200:
        raise ReadinessError(f"smoke completion answered HTTP {response.status_code}: {response.text[:300]}")
    try:
        text = str(response.json()["choices"][0]["text"])
    except (ValueError, KeyError, IndexError) as exc:
        raise ReadinessError(f"smoke completion returned no text: {response.text[:300]}") from exc
    if verify.smoke_expect not in text:
        why = f"smoke test failed: {verify.smoke_prompt!r} → {text!r}, which lacks {verify.smoke_expect!r}"
        raise ReadinessError(why)
    return text
