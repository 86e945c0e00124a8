"""Ways to run one rank on a node: ``docker`` containers and host ``process`` groups, and what
``up`` and ``down`` ask of every runtime at once (so ``apply/`` never names one)."""

from __future__ import annotations

from sparkfleet.config.cluster import Node
from sparkfleet.nodes.agent import node_agent, port_holders
from sparkfleet.nodes.identity import FoundRank, PortHolder
from sparkfleet.nodes.runtime.base import Runtime
from sparkfleet.nodes.runtime.docker import DockerRuntime
from sparkfleet.nodes.runtime.process import ProcessRuntime, found_processes
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import RankHandle, RankPlan

RUNTIMES: tuple[Runtime, ...] = (DockerRuntime(), ProcessRuntime())
__all__ = ["RUNTIMES", "Runtime", "find_ranks", "port_holders", "preflight", "remove_ranks", "runtime_for"]


def runtime_for(rank: RankPlan | RankHandle) -> Runtime:
    return DockerRuntime() if rank.runtime == "docker" else ProcessRuntime()


def find_ranks(transport: Transport, deployment: str, node: Node, *, containers: bool = True) -> list[FoundRank]:
    """Every rank of any instance of deployment on the node, in every runtime (``containers``
    False: host processes only, where the deployment runs none in docker)."""
    runtimes = RUNTIMES if containers else (ProcessRuntime(),)
    return [f for runtime in runtimes for f in runtime.find(transport, deployment, node)]


def remove_ranks(transport: Transport, found: list[FoundRank], node: Node, grace: float = 10.0) -> None:
    """Stop what ``find_ranks`` found on the node, whoever started it (``down --sweep``)."""
    for runtime in RUNTIMES:
        runtime.remove(transport, found, node, grace)


def preflight(transport: Transport, node: Node, deployment: str, ports: list[int], *,
              containers: bool) -> tuple[list[FoundRank], list[PortHolder]]:  # fmt: skip
    """What ``up`` checks on a node before it starts anything, in one agent call (and docker's
    own list where the node runs containers): the deployment's ranks already there, and who
    holds each of the ports."""
    answer = node_agent(transport, node.python, "preflight", {"deployment": deployment, "node": node.name,
                                                               "ports": sorted(ports)})  # fmt: skip
    found = found_processes(node.name, deployment, answer["found"])
    if containers:
        found += DockerRuntime().find(transport, deployment, node)
    return found, [PortHolder(**h) for h in answer["holders"]]
