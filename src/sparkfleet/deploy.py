"""The lifecycle: ``up`` executes a Plan on every node and is done only when the deployment
really serves; any failure, or Ctrl-C, stops every rank again. ``down`` stops a deployment,
even one whose local record was lost."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sparkfleet.cluster import Cluster
from sparkfleet.deployments import Deployment, Deployments
from sparkfleet.distribute import distribute
from sparkfleet.errors import NodeError, ReadinessError, SparkfleetError
from sparkfleet.fleet import fan_out, raise_first, transport_for
from sparkfleet.images import ensure_same_image
from sparkfleet.plan import Plan, RankPlan
from sparkfleet.readiness import smoke, wait_ready
from sparkfleet.runtime.base import Runtime
from sparkfleet.runtime.docker import DockerRuntime
from sparkfleet.runtime.process import ProcessRuntime
from sparkfleet.staging.runner import stage_all
from sparkfleet.transport.base import Transport

# Called with (node or None, rank or None, message) as up progresses.
Reporter = Callable[[str | None, int | None, str], None]
NODE_STAGED_KINDS = ("sparse-rows", "composed")
DISTRIBUTED_KINDS = ("sync", "copy", "nfs")


def runtime_for(rank: RankPlan) -> Runtime:
    """The runtime that runs this rank."""
    return DockerRuntime() if rank.runtime == "docker" else ProcessRuntime()


@dataclass(frozen=True)
class UpResult:
    """A ready deployment."""

    name: str
    endpoint: str
    smoke_answer: str
    seconds: float


def _quiet(_node: str | None, _rank: int | None, _msg: str) -> None:
    return None


def _connect(plan: Plan, accept_new_host_keys: bool) -> dict[str, Transport]:
    transports = {r.node.name: transport_for(r.node, accept_new_host_keys=accept_new_host_keys) for r in plan.ranks}
    # One cheap command per node opens each master connection and fails fast on a dead node.
    raise_first(fan_out(transports, lambda n: transports[n].run(["true"], timeout=30)))
    return transports


def _ensure_images(plan: Plan, transports: dict[str, Transport], report: Reporter) -> None:
    docker_ranks = [r for r in plan.ranks if r.runtime == "docker" and r.image]

    def ensure(node: str) -> None:
        rank = next(r for r in docker_ranks if r.node.name == node)
        image = rank.image or ""
        have = transports[node].run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                                    check=False, timeout=60)  # fmt: skip
        if have.ok:
            report(node, rank.rank, f"image {image} present ({have.stdout.strip()[:19]})")
            return
        if "Cannot connect" in have.stderr or "permission denied" in have.stderr.lower():
            raise NodeError(node, f"docker is not reachable: {have.tail(2)}")
        report(node, rank.rank, f"pulling {image}")
        pulled = transports[node].run(["docker", "pull", image], check=False, timeout=3600)
        if not pulled.ok:
            raise NodeError(node, f"image {image} is not on the node and could not be pulled: {pulled.tail(2)} "
                                  "(build it with `sparkfleet image build`)")  # fmt: skip

    raise_first(fan_out({r.node.name for r in docker_ranks}, ensure))


def _start_rank(plan: Plan, r: int, runtimes: dict[int, Runtime], transports: dict[str, Transport],
                records: Deployments, report: Reporter) -> None:  # fmt: skip
    rank = plan.rank(r)
    transport = transports[rank.node.name]
    ident = runtimes[r].start(rank, transport, plan.name)
    report(rank.node.name, r, f"started ({rank.runtime} {ident})")
    records.event(plan.name, "start", f"rank {r} started ({ident})", rank.node.name)


def rollback(plan_ranks: tuple[RankPlan, ...], name: str, transports: dict[str, Transport]) -> list[str]:
    """Stop every rank of the deployment on every reachable node; returns the nodes that failed."""

    def stop(node: str) -> None:
        for rank in (r for r in plan_ranks if r.node.name == node):
            runtime_for(rank).stop(rank, transports[node], name, grace=5.0)

    outcomes = fan_out({r.node.name for r in plan_ranks}, stop)
    return [f"{node}: {o.error}" for node, o in outcomes.items() if not o.ok]


def up(
    plan: Plan,
    cluster: Cluster,
    *,
    deployments: Deployments | None = None,
    report: Reporter = _quiet,
    timeout: float | None = None,
    accept_new_host_keys: bool = False,
    allow_image_mismatch: bool = False,
) -> UpResult:
    """Execute plan: stage, start ranks in launch order, wait until it really serves."""
    records = deployments or Deployments()
    start = time.monotonic()
    records.acquire(plan, cluster.source)
    records.event(plan.name, "up", f"up on {len(plan.ranks)} node(s) of {cluster.name}")
    transports: dict[str, Transport] = {}
    try:
        report(None, None, "connecting")
        transports = _connect(plan, accept_new_host_keys)
        _ensure_images(plan, transports, report)
        ensure_same_image(plan, transports, allow_mismatch=allow_image_mismatch)
        # Synced snapshots first (each node's copy is read back and compared with the source, and
        # a node that differs is refused): composed model directories link into them.
        if any(s.kind in DISTRIBUTED_KINDS for s in plan.staging):
            report(None, None, "distributing model files")
            for note in distribute(plan, transports).notes:
                report(None, None, note)
        staged = [s for s in plan.staging if s.kind in NODE_STAGED_KINDS]
        if staged:
            report(None, None, f"staging {len(staged)} step(s)")
            stage_all(staged, transports, pythons={r.node.name: r.node.python for r in plan.ranks})
        runtimes = {r.rank: runtime_for(r) for r in plan.ranks}
        # Workers first, all at once; the head last, once every worker runs (the seeds' order).
        workers = [r for r in plan.launch_order if r != 0]
        for batch in ([str(r) for r in workers], ["0"]):
            raise_first(fan_out(batch, lambda r: _start_rank(plan, int(r), runtimes, transports, records, report)))
        wait_ready(
            plan, transports, runtimes, timeout=timeout or plan.recipe.verify.timeout,
            on_progress=lambda msg: report(plan.head.node.name, 0, msg),
        )  # fmt: skip
        report(plan.head.node.name, 0, "healthy; smoke test")
        answer = smoke(plan)
    except BaseException as exc:
        report(None, None, "rolling back")
        failed = rollback(plan.ranks, plan.name, transports) if transports else []
        records.set_status(plan.name, "failed")
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc)
        records.event(plan.name, "failed", why)
        if failed:
            raise SparkfleetError(f"{why}\nrollback could not reach: " + "; ".join(failed)) from exc
        if isinstance(exc, KeyboardInterrupt):
            raise ReadinessError(f"{plan.name}: interrupted; every started rank was stopped") from exc
        raise
    records.set_status(plan.name, "ready")
    records.event(plan.name, "ready", f"ready at {plan.endpoint}; smoke answer {answer.strip()[:60]!r}")
    return UpResult(plan.name, plan.endpoint, answer, time.monotonic() - start)


def down(deployment: Deployment, *, deployments: Deployments | None = None,
         accept_new_host_keys: bool = False) -> list[str]:  # fmt: skip
    """Stop every rank of a recorded deployment (idempotent); returns what was stopped."""
    records = deployments or Deployments()
    transports = {r.node.name: transport_for(r.node, accept_new_host_keys=accept_new_host_keys)
                  for r in deployment.ranks}  # fmt: skip
    records.set_status(deployment.name, "stopping")
    stopped: list[str] = []

    def stop(node: str) -> list[str]:
        out: list[str] = []
        for rank in (r for r in deployment.ranks if r.node.name == node):
            out += [f"{node} rank {rank.rank}: {x}" for x in runtime_for(rank).stop(rank, transports[node],
                                                                                     deployment.name)]
        return out

    outcomes = fan_out(transports, stop)
    errors = [f"{n}: {o.error}" for n, o in outcomes.items() if not o.ok]
    for o in outcomes.values():
        stopped += o.value or []
    if errors:
        records.event(deployment.name, "down-failed", "; ".join(errors))
        raise SparkfleetError(f"{deployment.name}: could not stop every rank: " + "; ".join(errors))
    records.set_status(deployment.name, "stopped")
    records.event(deployment.name, "down", f"stopped {len(stopped)} container(s)/process(es)")
    return stopped


def sweep(cluster: Cluster, name: str) -> list[str]:
    """Stop anything of deployment name on every node of cluster (for a lost local record)."""

    def clean(node_name: str) -> list[str]:
        node = cluster.node(node_name)
        transport = transport_for(node)
        found = [f"{node_name}: container {c}" for c in DockerRuntime().find(transport, name)]
        if found:
            transport.run(["docker", "rm", "-f", *[f.split()[-1] for f in found]], check=False, timeout=120)
        pids = ProcessRuntime().find(transport, name, node_name, node.python)
        if pids:
            transport.run(["kill", "-KILL", *pids], check=False)
        return found + [f"{node_name}: pid {p}" for p in pids]

    out: list[str] = []
    for outcome in fan_out([n.name for n in cluster.nodes], clean).values():
        if outcome.error is not None:
            raise outcome.error
        out += outcome.value or []
    return out
