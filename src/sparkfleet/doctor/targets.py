"""What doctor checks against (the fleet's nodes and what the recipe needs of each) and the
shape of one verdict. `run.spec_for` builds a DoctorSpec from a cluster or a Plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["pass", "warn", "fail"]
FLEET = "fleet"


@dataclass(frozen=True)
class Check:
    """One verdict: which check, on which node (or `fleet`), what was seen, how to fix it."""

    id: str
    node: str
    status: Status
    evidence: str
    fix: str = ""


@dataclass(frozen=True)
class NodeTarget:
    """What doctor expects of one node (of the rank planned on it, with a recipe)."""

    name: str
    fabric_ip: str
    ssh_port: int = 22
    user: str | None = None
    gpus: str = "all"
    rdma: bool = False
    rdma_required: bool = False
    ib_gid_index: int | None = None
    hf_cache: str | None = None
    python: str = "python3"  # the node's interpreter, for the stream test shipped where iperf3 is missing
    staging: tuple[tuple[str, str, int], ...] = ()
    ports: tuple[int, ...] = ()
    memlock: str | None = None
    head: bool = False
    # The rank's effective network env: (key, value, source layer), as planned for this node.
    env: tuple[tuple[str, str, str], ...] = ()
    argv: tuple[str, ...] = ()  # the rank's engine argv, for the addresses it advertises

    def env_map(self) -> dict[str, tuple[str, str]]:
        return {k: (v, src) for k, v, src in self.env}


@dataclass(frozen=True)
class DoctorSpec:
    """The fleet and what the recipe (if any) needs from it."""

    nodes: tuple[NodeTarget, ...]
    image: str | None = None
    model_repo: str | None = None
    needs_docker: bool = False
    # Ports every node tries on every other node's fabric address (the rendezvous ports);
    # empty: each node's ssh_port.
    mesh_ports: tuple[int, ...] = ()
