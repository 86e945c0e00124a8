"""Ways to run one rank on a node: ``docker`` containers and host ``process`` groups."""

from __future__ import annotations

from sparkfleet.nodes.runtime.base import Runtime
from sparkfleet.nodes.runtime.docker import DockerRuntime
from sparkfleet.nodes.runtime.process import ProcessRuntime
from sparkfleet.plan.model import RankHandle, RankPlan


def runtime_for(rank: RankPlan | RankHandle) -> Runtime:
    """The runtime that runs this rank."""
    return DockerRuntime() if rank.runtime == "docker" else ProcessRuntime()
