"""Instances of a deployment that this controller started and its record no longer names.

The record names one instance. An ``up`` killed before it could roll back, whose record a
later version (or a hand-edited state dir) replaced, leaves ranks that only their markers name:
the deployment, this controller's owner string and the instance's start time. ``down NAME``
looks for them on the record's nodes and stops them too, naming each with its start time;
ranks of another owner are left to ``down --sweep``.
"""

from __future__ import annotations

from sparkfleet.config.cluster import Node
from sparkfleet.nodes.fanout import fan_out, raise_first
from sparkfleet.nodes.identity import FoundRank, controller_owner
from sparkfleet.nodes.runtime import find_ranks, remove_ranks
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.state.deployments import Deployment


def other_instances(deployment: Deployment, transports: dict[str, Transport]) -> list[FoundRank]:
    """Running ranks of deployment's name on its nodes that this controller started under
    another instance than the recorded one (asked through down's own transports: its sessions)."""
    nodes: dict[str, Node] = {r.node.name: r.node for r in deployment.ranks}
    containers = any(r.runtime == "docker" for r in deployment.ranks)
    me = controller_owner()

    def look(name: str) -> list[FoundRank]:
        found = find_ranks(transports[name], deployment.name, nodes[name], containers=containers)
        return [f for f in found if f.owner == me and f.instance != deployment.instance and f.running]

    # A node that cannot be reached is named by down's own check of the recorded instance.
    return [f for o in fan_out(list(nodes), look).values() if o.ok and o.value for f in o.value]


def stop_instances(deployment: Deployment, found: list[FoundRank], transports: dict[str, Transport]) -> None:
    """Stop what other_instances found (the node agent re-checks each pid's markers)."""
    nodes: dict[str, Node] = {r.node.name: r.node for r in deployment.ranks}

    def stop(name: str) -> None:
        remove_ranks(transports[name], [f for f in found if f.node == name], nodes[name])

    raise_first(fan_out(sorted({f.node for f in found}), stop))
