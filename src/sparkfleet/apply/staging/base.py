"""What every staging kind's runner is given (``Context``) and is (``Runner``), and the report
of the kinds that run on each node (``StageReport``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from sparkfleet.errors import StagingError
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import Plan
from sparkfleet.plan.staging import Entry, StagingStep

if TYPE_CHECKING:
    from sparkfleet.apply.staging.composed import ComposedModel
    from sparkfleet.config.cluster import Node

ProgressFn = Callable[[StagingStep, int, int], None]
Fanout = Literal["pipeline", "push"]  # a chain of nodes (pipeline.py), or the source to every target at once
Method = Literal["auto", "rsync", "tar"]  # how a sync moves files (auto: rsync where both ends have it)
Phase = Literal["fetch", "distribute", "node"]  # in this order (phase.py)
T = TypeVar("T")


@dataclass(frozen=True)
class Context:
    """What a kind's runner works with; ``plan`` is there for the kinds that need the
    deployment (fetch and distribution)."""

    transports: Mapping[str, Transport]
    plan: Plan | None = None
    verify: bool = False
    progress: ProgressFn | None = None
    say: Callable[[str], None] = lambda _m: None
    method: Method = "auto"
    fanout: Fanout = "pipeline"
    chunk_bytes: int | None = None
    pythons: Mapping[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what the user must be told, node first

    def note(self, node: str, message: str) -> None:
        self.notes.append(f"{node}: {message}")
        self.say(message)

    def transport(self, node: str) -> Transport:
        if node not in self.transports:
            raise StagingError(node, "no transport for this node")
        return self.transports[node]

    def python(self, node: str) -> str:
        nodes = self.nodes() if self.plan is not None else {}
        return self.pythons.get(node) or (nodes[node].python if node in nodes else "python3")

    def nodes(self) -> dict[str, Node]:
        assert self.plan is not None, "this kind runs with the plan"
        return {r.node.name: r.node for r in self.plan.ranks}

    def parallel(self, jobs: Mapping[str, Callable[[], T]]) -> list[T]:
        """One job per node at once; one StagingError naming every node that failed."""
        return list(fan_out(jobs, lambda n: jobs[n](), workers=max(1, len(jobs))).raise_all(StagingError).values())


@dataclass(frozen=True)
class Runner:
    """How one kind runs: ``stage(context, steps)`` returns its reports. A ``node`` kind is given one
    node's steps of the kind (and is what ``--verify`` checks); the others one entry's on every node."""

    entry: type[Entry]
    phase: Phase
    stage: Callable[[Context, Sequence[StagingStep]], Sequence[Any]]


@dataclass(frozen=True)
class OutputReport:
    """One staged file: what was found (``status``) and what was done (``action``)."""

    path: str
    layout: str
    size: int
    status: str  # ok | missing | unvouched | source-changed | modified | damaged
    action: str  # verified | packed | repaired
    bytes_written: int
    chunks_rewritten: int
    chunks_total: int


@dataclass(frozen=True)
class StageReport:
    """What one step of a kind that runs on the node did there."""

    node: str
    step_id: str
    rank: int
    kind: str
    seconds: float
    outputs: tuple[OutputReport, ...] = ()
    hash: str | None = None
    composed: ComposedModel | None = None

    def rows(self, verify: bool) -> list[dict[str, object]]:
        """One row per staged file or composed directory."""
        rows: list[dict[str, object]] = [
            {"node": self.node, "rank": self.rank, "step": self.step_id, "path": out.path, "status": out.status,
             "action": out.action, "bytes_written": out.bytes_written, "chunks_rewritten": out.chunks_rewritten,
             "chunks_total": out.chunks_total}
            for out in self.outputs
        ]  # fmt: skip
        if self.composed is not None:
            c = self.composed
            rows.append({"node": self.node, "rank": self.rank, "step": self.step_id, "path": c.model_dir,
                         "status": "; ".join(c.problems) or "ok", "action": "verified" if verify else "composed",
                         "bytes_written": 0, "links": c.links, "hard_links": c.hard_links,
                         "extra_mounts": list(c.extra_mounts)})  # fmt: skip
        return rows
