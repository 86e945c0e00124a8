"""The Runtime interface: start, inspect, read the logs of, and stop one rank.

``start`` takes the rank's plan (its env and container argv); everything after takes the rank's
``RankHandle`` (``RankPlan.handle``, or what the state store kept), which carries no env."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from sparkfleet.config.cluster import Node
from sparkfleet.errors import RankRuntimeError
from sparkfleet.nodes.identity import FoundRank, Instance
from sparkfleet.nodes.transport.base import Stream, Transport
from sparkfleet.plan.model import RankHandle, RankPlan

State = Literal["running", "exited", "absent"]


@dataclass(frozen=True)
class RankState:
    """What a rank is doing right now on its node."""

    rank: int
    node: str
    state: State
    exit_code: int | None = None
    started_at: float | None = None
    ident: str | None = None
    exited_at: float | None = None  # when it ended, where the runtime knows


class Runtime(Protocol):
    """Start, watch and stop one rank through its node's Transport."""

    def start(self, rank: RankPlan, transport: Transport, instance: Instance) -> str:
        """Start the rank, marked with instance; returns its container id or pid."""

    def inspect(self, rank: RankHandle, transport: Transport) -> RankState:
        """Whether the rank runs, and since when."""

    def probe(self, rank: RankHandle, transport: Transport) -> tuple[RankState, str]:
        """inspect and the whole recent log together (readiness polls this)."""

    def logs(self, rank: RankHandle, transport: Transport, tail: int | None = 200) -> str:
        """The last lines of the rank's log (all of it when tail is None)."""

    def follow(self, rank: RankHandle, transport: Transport) -> Stream:
        """The log's last lines, then every new line as it comes (until the stream is closed)."""

    def stop(self, rank: RankHandle, transport: Transport, deployment: str, instance: str | None,
             grace: float = 10.0) -> list[str]:  # fmt: skip
        """Stop the rank of that instance (idempotent; None: any instance, for records from before
        instance ids); returns what was stopped."""

    def find(self, transport: Transport, deployment: str, node: Node) -> list[FoundRank]:
        """Every rank of any instance of deployment on the node, with its owner."""

    def remove(self, transport: Transport, found: list[FoundRank], node: Node, grace: float = 10.0) -> None:
        """Stop what find returned, whoever owns it (``down --sweep``)."""


def env_file_text(rank: RankPlan) -> bytes:
    """The rank's environment as a Docker env file (``KEY=VALUE`` lines, no quoting)."""
    lines = []
    for var in rank.env:
        if "\n" in var.value or "\r" in var.value:
            raise RankRuntimeError(rank.node.name, f"env {var.key}: a value cannot contain a line break")
        lines.append(f"{var.key}={var.value}\n")
    return "".join(lines).encode()
