"""doctor: is every node ready for this recipe?

Facts are gathered on all nodes at once (one bundled round trip per node, in threads); the
checks (sparkfleet.doctor.checks) are a pure function of those facts, so the whole runs end to end
against the loopback fleet and each check is tested on captured outputs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from sparkfleet.config.cluster import Cluster
from sparkfleet.doctor.checks import Check, DoctorSpec, MemoryFn, NodeTarget, evaluate
from sparkfleet.doctor.probes.facts import FactsRequest, NodeFacts, collect
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.build import cluster_env
from sparkfleet.plan.memory import MemoryPlan, memory_plan
from sparkfleet.plan.model import Plan

__all__ = [
    "Check",
    "DoctorSpec",
    "NodeTarget",
    "Report",
    "evaluate",
    "gather",
    "memory_for",
    "run_doctor",
    "spec_for",
]


@dataclass(frozen=True)
class Report:
    """Every check, in a stable order, and how long the run took."""

    checks: tuple[Check, ...]
    seconds: float
    memory: tuple[tuple[str, MemoryPlan], ...] = ()

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == "fail")

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        return {s: sum(1 for c in self.checks if c.status == s) for s in ("pass", "warn", "fail")}

    def to_json(self) -> dict[str, object]:
        """The report as JSON-ready data (for `doctor --json`)."""
        return {
            "ok": not self.failed,
            "seconds": round(self.seconds, 3),
            "counts": self.counts(),
            "checks": [asdict(c) for c in self.checks],
            "memory": {node: asdict(mp) for node, mp in self.memory},
        }


def mesh_targets(spec: DoctorSpec, target: NodeTarget) -> tuple[tuple[str, int], ...]:
    """What one node tries: every other node's fabric address on the rendezvous ports (each
    node's ssh_port without a recipe) — the full mesh, as NCCL rings connect every pair; a node
    alone tries its own."""
    others = [n for n in spec.nodes if n.name != target.name] or [target]
    return tuple((n.fabric_ip, p) for n in others for p in (spec.mesh_ports or (n.ssh_port,)))


def request_for(spec: DoctorSpec, target: NodeTarget) -> FactsRequest:
    """What to probe on one node: its part of the mesh, and on the head the checkpoint."""
    return FactsRequest(
        image=spec.image,
        disk_paths=tuple(dst for _, dst, _ in target.staging),
        hf_cache=target.hf_cache,
        model_repo=spec.model_repo,
        reach_targets=mesh_targets(spec, target),
        checkpoint_headers=target.head,
    )


def gather(spec: DoctorSpec, transports: Mapping[str, Transport], *, timeout: float = 15.0) -> dict[str, NodeFacts]:
    """Facts of every node, probed in parallel (one thread and one round trip per node)."""
    names = [n.name for n in spec.nodes]
    by_name = {n.name: n for n in spec.nodes}
    group = fan_out(names, lambda name: collect(transports[name], request_for(spec, by_name[name]), timeout=timeout),
                    workers=max(1, len(names)))  # fmt: skip
    return group.raise_first()  # collect turns a node's failure into its facts: only a bug raises


def run_doctor(
    spec: DoctorSpec,
    transports: Mapping[str, Transport],
    memory: MemoryFn | None = None,
    *,
    timeout: float = 15.0,
) -> Report:
    """Gather facts on every node in parallel and evaluate every check."""
    start = time.monotonic()
    facts = gather(spec, transports, timeout=timeout)
    plans: dict[str, MemoryPlan | None] = {}
    if memory is not None:
        plans = {t.name: memory(t, facts) for t in spec.nodes if facts[t.name].reachable}
    checks = evaluate(spec, facts, (lambda t, _f: plans.get(t.name)) if memory else None)
    kept = tuple((name, mp) for name, mp in plans.items() if mp is not None)
    return Report(checks=checks, seconds=time.monotonic() - start, memory=kept)


def sort_for_display(checks: Sequence[Check]) -> list[Check]:
    """Failures first, then warnings, then passes; stable within each."""
    order = {"fail": 0, "warn": 1, "pass": 2}
    return sorted(checks, key=lambda c: order[c.status])


def spec_for(cluster: Cluster, p: Plan | None = None) -> DoctorSpec:
    """What to check: the plan's nodes, image, staging, ports and model, or (without a
    recipe) only the cluster's nodes."""
    if p is None:
        # The cluster layer each rank would get (no engine: no host-IP keys).
        targets = tuple(
            NodeTarget(
                name=n.name,
                fabric_ip=n.fabric_ip,
                ssh_port=n.ssh_port or 22,
                user=n.user,
                gpus=n.gpus,
                rdma=n.rdma,
                ib_gid_index=n.ib_gid_index,
                hf_cache=n.hf_cache,
                python=n.python,
                head=i == 0,
                env=tuple((k, v, "cluster") for k, v in sorted(cluster_env(n, ()).items())),
            )
            for i, n in enumerate(cluster.nodes)
        )
        return DoctorSpec(nodes=targets)
    targets_list = []
    for rank in p.ranks:
        n = rank.node
        env = {e.key: e.value for e in rank.env}
        uses_ib = env.get("NCCL_NET", "").upper() == "IB" or bool(env.get("NCCL_IB_HCA"))
        targets_list.append(
            NodeTarget(
                name=n.name,
                fabric_ip=n.fabric_ip,
                ssh_port=n.ssh_port or 22,
                user=n.user,
                gpus=n.gpus,
                rdma=n.rdma and len(p.ranks) > 1,
                rdma_required=uses_ib and env.get("NCCL_IB_DISABLE") != "1" and len(p.ranks) > 1,
                ib_gid_index=n.ib_gid_index,
                hf_cache=n.hf_cache,
                python=n.python,
                staging=tuple((s.id, s.dst, s.min_free) for s in p.staging if s.node == n.name and s.min_free),
                ports=rank.ports,
                memlock=n.memlock,
                head=rank.rank == 0,
                env=tuple((e.key, e.value, e.source) for e in rank.env if e.key in _NETWORK_ENV),
                argv=rank.argv,
            )
        )
    return DoctorSpec(
        nodes=tuple(targets_list),
        image=p.image.ref if p.image else None,
        model_repo=p.model_repo,
        needs_docker=p.image is not None,
        mesh_ports=rendezvous_ports(p),
    )


# What the network checks read of a rank's env (never a secret).
_NETWORK_ENV = frozenset({
    "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_DISABLE",
    "NCCL_NET", "SGLANG_HOST_IP", "VLLM_HOST_IP",
})  # fmt: skip


def rendezvous_ports(p: Plan) -> tuple[int, ...]:
    """The ports ranks open for each other (every rank's planned ports but the HTTP one)."""
    if len(p.ranks) < 2:
        return ()
    return tuple(sorted({port for r in p.ranks for port in r.ports} - {p.port}))


def memory_for(p: Plan) -> MemoryFn:
    """The memory check's plan maker: each node's rank, its GPU and meminfo facts, and the
    checkpoint headers and config the head read."""
    ranks = {r.node.name: r for r in p.ranks}
    head = p.ranks[0].node.name

    def make(t: NodeTarget, facts: Mapping[str, NodeFacts]) -> MemoryPlan | None:
        if t.gpus == "none":
            return None  # CPU ranks size their KV by engine-specific settings, not a GPU pool
        f, h = facts[t.name], facts.get(head)
        return memory_plan(
            ranks[t.name],
            p.memory,
            gpu=f.gpu,
            meminfo=f.meminfo,
            tensors=h.tensors if h else None,
            model_config=h.model_config if h else None,
        )

    return make
