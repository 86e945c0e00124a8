"""One round trip per node (docker ranks add a ``docker inspect`` or ``docker ps``) for what
``watch`` polls (``watch_node``) and what ``down`` checks afterwards (``leftovers_on``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from sparkfleet.config.cluster import Node
from sparkfleet.nodes.agent import node_agent
from sparkfleet.nodes.runtime.base import RankState
from sparkfleet.nodes.runtime.docker import DockerRuntime
from sparkfleet.nodes.runtime.process import rank_state
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import RankHandle


@dataclass(frozen=True)
class NodeWatch:
    """One node's answer to one poll."""

    node: str
    ranks: dict[int, RankState]
    mem_available: int | None  # bytes
    agent_cpu_s: float | None  # CPU the agent itself used on the node (the watcher's cost there)
    seconds: float  # the round trip, as the controller waited for it


def watch_node(transport: Transport, node: Node, ranks: Sequence[RankHandle]) -> NodeWatch:
    """States of ranks (all on node) and the node's MemAvailable."""
    start = time.monotonic()
    process = [r for r in ranks if r.runtime == "process"]
    paths = [{"pid_path": r.pid_path, "exit_path": r.exit_path} for r in process]
    answer = node_agent(transport, node.python, "watch", {"ranks": paths}, timeout=30)
    states = {r.rank: rank_state(r.rank, node.name, s) for r, s in zip(process, answer["ranks"], strict=True)}
    for rank in (r for r in ranks if r.runtime == "docker"):
        states[rank.rank] = DockerRuntime().inspect(rank, transport)
    return NodeWatch(node.name, states, answer.get("mem_available"), answer.get("cpu_s"), time.monotonic() - start)


@dataclass(frozen=True)
class Leftover:
    """Something of the instance still on a node after its ranks were stopped."""

    node: str
    kind: str  # "process" or "container"
    ident: str  # pid or container name
    why: str
    command: str = ""
    rank: int | None = None

    def describe(self) -> str:
        what = f"pid {self.ident}" if self.kind == "process" else f"container {self.ident}"
        rank = f", rank {self.rank}" if self.rank is not None else ""
        command = f" ({self.command})" if self.command else ""
        return f"{self.node}: {what}{command}{rank}: {self.why}"


@dataclass(frozen=True)
class NodeAfter:
    """A node as down left it."""

    node: str
    leftovers: tuple[Leftover, ...]
    mem_available: int | None
    gpu_apps_csv: str | None  # nvidia-smi's compute apps, None where there is no nvidia-smi
    gpu_error: str | None


def leftovers_on(transport: Transport, node: Node, deployment: str, instance: str | None, since: float | None,
                 ranks: Sequence[RankHandle], gpu_command: Sequence[str]) -> NodeAfter:  # fmt: skip
    """What is left of the instance on node (ranks: the deployment's ranks there)."""
    payload: dict[str, object] = {
        "deployment": deployment, "node": node.name, "instance": instance, "since": since or 0,
        "workdir": ranks[0].workdir if ranks else "", "ports": sorted({p for r in ranks for p in r.ports}),
        "gpu_command": list(gpu_command),
    }  # fmt: skip
    answer = node_agent(transport, node.python, "leftovers", payload, timeout=60)
    found = [Leftover(node.name, "process", str(f["pid"]), f["why"], f["command"], f["rank"]) for f in answer["found"]]
    if any(r.runtime == "docker" for r in ranks):
        for c in DockerRuntime().find(transport, deployment, node):
            if instance is None or c.instance == instance:
                state = "running" if c.running else "stopped but not removed"
                found.append(Leftover(node.name, "container", c.ident, f"the instance's container ({state})",
                                      rank=c.rank))  # fmt: skip
    return NodeAfter(node.name, tuple(found), answer.get("mem_available"), answer.get("gpu_apps"),
                     answer.get("gpu_error"))  # fmt: skip
