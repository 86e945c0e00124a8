"""``up`` executes a Plan on every node and is done only when the deployment really serves; any
failure, or Ctrl-C, stops every rank again (down.py's ``stop_ranks``, in the engine's order)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

from sparkfleet.apply.configurations import ConfigSpec, record
from sparkfleet.apply.down import stop_ranks
from sparkfleet.apply.images import ensure_same_image
from sparkfleet.apply.readiness import Reporter, await_worker_ports, smoke, wait_ready
from sparkfleet.apply.staging.phase import stage
from sparkfleet.config.secrets import redact, secrets_of
from sparkfleet.doctor.pairs import Thresholds, run_fabric
from sparkfleet.doctor.targets import NodeTarget
from sparkfleet.errors import FabricError, RankExited, RollbackIncomplete, SparkfleetError, StateError
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.identity import FoundRank, Instance, PortHolder
from sparkfleet.nodes.runtime import preflight, runtime_for
from sparkfleet.nodes.runtime.base import Runtime
from sparkfleet.nodes.runtime.docker import ensure_image
from sparkfleet.nodes.transport import Connector, transport_for
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import Plan
from sparkfleet.state.deployments import Deployments


@dataclass(frozen=True)
class UpResult:
    """A ready deployment."""

    name: str
    endpoint: str
    smoke_answer: str
    seconds: float
    configuration: int | None = None  # its row in the history of configurations


def _preflight(plan: Plan, transports: dict[str, Transport], instance: Instance) -> None:
    """Before anything is written or started: no other instance of this name on any of its
    nodes, and every port a rank needs free. One agent call per node (two with docker ranks)."""

    def check(node_name: str) -> tuple[list[FoundRank], list[tuple[PortHolder, str]]]:
        ranks = [r for r in plan.ranks if r.node.name == node_name]
        roles = {p: f"rank {r.rank} rendezvous/RPC" for r in ranks for p in r.ports}
        if any(r.rank == 0 for r in ranks):
            roles[plan.port] = "rank 0 HTTP"
        found, holders = preflight(transports[node_name], ranks[0].node, plan.name, list(roles),
                                   containers=any(r.runtime == "docker" for r in ranks))  # fmt: skip
        return [f for f in found if f.instance != instance.id], [(h, roles[h.port]) for h in holders]

    results = fan_out(transports, check).raise_first()
    others = [f for found, _ in results.values() for f in found]
    if others:
        owners = ", ".join(sorted({f.owner or "an older sparkfleet" for f in others}))
        listed = "\n  ".join(f.describe() for f in others)
        raise StateError(f"deployment {plan.name!r} is already on its nodes under another instance (owner {owners}):"
                         f"\n  {listed}\nstop it from where it was started (`sparkfleet down {plan.name}`), pick "
                         f"another name (`up --name`), or, if it is abandoned, `sparkfleet down {plan.name} --sweep "
                         "--cluster FILE`")  # fmt: skip
    taken = [(node, holder, role) for node, (_, held) in results.items() for holder, role in held]
    if taken:
        listed = "\n  ".join(f"{node}: port {h.port} ({role}) is held by {h.describe()}" for node, h, role in taken)
        raise StateError(f"{plan.name}: port(s) needed by the deployment are taken; nothing was started:\n  {listed}")


@contextmanager
def _handling(handler: Callable[[int, FrameType | None], None] | int, *signals: int) -> Iterator[None]:
    """handler for signals while the block runs (only the main thread can set one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, before in old.items():
            signal.signal(sig, before)


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def sigterm_interrupts() -> contextlib.AbstractContextManager[None]:
    """SIGTERM during up behaves like Ctrl-C: everything started is rolled back."""
    return _handling(_interrupt, signal.SIGTERM)


def shielded() -> contextlib.AbstractContextManager[None]:
    """A second Ctrl-C or SIGTERM must not cut a rollback short and leave ranks running."""
    return _handling(signal.SIG_IGN, signal.SIGINT, signal.SIGTERM)


def _ensure_images(plan: Plan, transports: dict[str, Transport], report: Reporter) -> None:
    docker_ranks = [r for r in plan.ranks if r.runtime == "docker" and r.image]
    if docker_ranks:
        report(None, None, "checking images")

    def ensure(node: str) -> None:
        rank = next(r for r in docker_ranks if r.node.name == node)
        image = rank.image or ""
        have = ensure_image(transports[node], image, on_pull=lambda: report(node, rank.rank, f"pulling {image}"))
        if have is not None:
            report(node, rank.rank, f"image {image} present ({have[:19]})")

    fan_out({r.node.name for r in docker_ranks}, ensure).raise_first()


def _start_rank(plan: Plan, r: int, runtimes: dict[int, Runtime], transports: dict[str, Transport],
                report: Reporter, instance: Instance) -> tuple[float, str, str, str | None]:  # fmt: skip
    """Start rank r; its "start" event, for the caller to record with the rest of its batch."""
    rank = plan.rank(r)
    ident = runtimes[r].start(rank, transports[rank.node.name], instance)
    report(rank.node.name, r, f"started ({rank.runtime} {ident})")
    return time.time(), "start", f"rank {r} started ({ident})", rank.node.name


def up(plan: Plan, *, config: ConfigSpec | None = None, deployments: Deployments | None = None,
       report: Reporter = lambda _n, _r, _m: None, timeout: float | None = None, allow_image_mismatch: bool = False,
       connect: Connector = transport_for) -> UpResult:  # fmt: skip
    """Execute plan: stage, start ranks in launch order, wait until it really serves. The outcome is
    recorded in the history of configurations (``config``: what the plan was made from)."""
    config = config or ConfigSpec.of_plan(plan)
    records = deployments or Deployments()
    start = time.monotonic()
    instance = Instance.new(plan.name)
    records.acquire(plan, plan.cluster_source, instance)
    records.event(plan.name, "up", f"up on {len(plan.ranks)} node(s) of {plan.cluster_name} (instance {instance.id})")
    transports: dict[str, Transport] = {}
    secrets = secrets_of((v.key, v.value) for r in plan.ranks for v in r.env)
    try:
        with sigterm_interrupts():
            answer = _run_up(plan, instance, records, report, timeout, allow_image_mismatch, transports, connect)
    except BaseException as exc:
        with shielded():
            report(None, None, "rolling back")
            # Every rank of this instance on every node reached so far, in the engine's stop order.
            stopped = stop_ranks(tuple(r.handle for r in plan.ranks), transports, plan.name, instance.id, grace=5.0)
            failed = {node: str(error) for node, error in stopped.failed.items()}
            if isinstance(exc, RankExited):
                exc.refresh()  # every rank is stopped now: the dead rank's log is final
            records.set_status(plan.name, "failed")
            why = redact("interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc), secrets)
            records.event(plan.name, "failed", why)
            with contextlib.suppress(SparkfleetError, OSError):  # the error that ended up comes first
                record(config, plan, False, records.store, transports, note=why)
        if failed:
            raise RollbackIncomplete(why, failed) from exc
        if isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt(f"{plan.name}: every started rank was stopped") from exc
        if isinstance(exc, SparkfleetError):
            # Same error type, its text with the deployment's secrets hidden (log tails in it).
            exc.message, exc.args = why, (why,)
        raise
    records.set_status(plan.name, "ready")
    records.event(plan.name, "ready", f"ready at {plan.endpoint}; smoke answer {answer.strip()[:60]!r}")
    configuration = record(config, plan, True, records.store, transports)
    return UpResult(plan.name, plan.endpoint, answer, time.monotonic() - start, configuration)


def _require_fabric(plan: Plan, min_gbps: float, transports: dict[str, Transport]) -> None:
    """`[verify] fabric_min_gbps`: every pair of the plan's nodes measured (doctor --fabric) before
    anything starts; any failing pair refuses the launch."""
    targets = [NodeTarget(name=r.node.name, fabric_ip=r.node.fabric_ip) for r in plan.ranks]
    fabric = run_fabric(targets, transports, thresholds=Thresholds(min_mbps=min_gbps * 1000))
    if fabric.failed:
        lines = [f"{c.id} {c.node}: {c.evidence}" for c in fabric.failed]
        raise FabricError("the fabric failed the pair test that [verify] fabric_min_gbps asks for; nothing was "
                          "started (sparkfleet doctor --fabric shows the matrix):\n" + "\n".join(lines))  # fmt: skip


def _run_up(plan: Plan, instance: Instance, records: Deployments, report: Reporter, timeout: float | None,
            allow_image_mismatch: bool, transports: dict[str, Transport], connect: Connector) -> str:  # fmt: skip
    """The phases of up in order; fills transports as it connects, so rollback can reach them."""
    report(None, None, "connecting")
    # No round trip of its own: the preflight's agent call is each node's first command; it
    # opens the master connection and fails on a dead node the same way a `true` would.
    transports.update({r.node.name: connect(r.node) for r in plan.ranks})
    if plan.verify.fabric_min_gbps is not None and len(plan.ranks) > 1:
        report(None, None, "measuring the fabric, every pair")
        _require_fabric(plan, plan.verify.fabric_min_gbps, transports)
    report(None, None, "checking names and ports")
    _preflight(plan, transports, instance)
    _ensure_images(plan, transports, report)
    ensure_same_image(plan, transports, allow_mismatch=allow_image_mismatch)
    stage(plan, transports, say=lambda message: report(None, None, message))
    runtimes = {r.rank: runtime_for(r) for r in plan.ranks}
    # Workers first, all at once; the head last, once every worker runs (the seeds' order).
    for batch in ([str(r) for r in plan.launch_order if r != 0], ["0"]):
        started = fan_out(batch, lambda r: _start_rank(plan, int(r), runtimes, transports, report, instance))
        # One transaction per batch, the ranks that failed to start left out, before any error.
        records.events_at(plan.name, sorted(started.succeeded.values()))
        started.raise_first()
        if batch != ["0"]:
            await_worker_ports(plan, runtimes, transports, report)
    boot = wait_ready(plan, transports, runtimes, instance, timeout=timeout or plan.verify.timeout,
                      on_progress=lambda msg: report(plan.head.node.name, 0, msg))  # fmt: skip
    records.event(plan.name, "healthy", boot.describe(), plan.head.node.name)
    report(plan.head.node.name, 0, "healthy; smoke test")
    return smoke(plan)
