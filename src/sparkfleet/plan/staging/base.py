"""What every staging kind is: an entry (its keys, validated when the recipe loads), the steps it
plans on the nodes, and what ``plan`` shows of them. Each kind is one module of this package,
listed in its ``KINDS``; how a kind runs is the module of the same name in ``apply/staging/``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, field_validator

from sparkfleet.config.sizes import Size
from sparkfleet.config.templates import node_values, render

if TYPE_CHECKING:
    from sparkfleet.config.cluster import Node

COMMON = ("kind", "id", "src", "dst", "min_free")


@dataclass(frozen=True)
class Planning:
    """What a kind plans with: the deployment, its nodes in rank order, the recipe's tensor
    parallel size and revision."""

    deployment: str
    nodes: tuple[Node, ...]
    tp: int = 1
    revision: str | None = None

    def values(self, rank: int) -> dict[str, str]:
        """The template values of the rank on its node."""
        return node_values(self.nodes[rank], rank, self.deployment)

    def rank_of(self, node: str) -> int:
        return next(i for i, n in enumerate(self.nodes) if n.name == node)


class Entry(BaseModel):
    """One staging entry: a ``[[staging]]`` table as written, or one a kind plans for a section of
    its own (``written = False``: the composed model, the Hub fetch). Each kind fixes ``kind``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    written: ClassVar[bool] = True  # a user may write it as a [[staging]] entry

    kind: str
    id: str
    src: str | None = None
    dst: str
    min_free: Size = 0

    @field_validator("src", "dst")
    @classmethod
    def _absolute_or_template(cls, value: str | None) -> str | None:
        if value is not None and not (value.startswith("/") or value.startswith("{{")):
            raise ValueError(f"{value!r} must be an absolute path (or start with a template like {{{{hf}}}})")
        return value

    def problem(self) -> str | None:
        """What the entry lacks, found without a cluster (``validate`` and ``plan`` refuse it)."""
        return None

    def named_nodes(self) -> dict[str, str]:
        """The keys of the entry that name a node, and the node they name."""
        return {}

    def steps(self, at: Planning) -> tuple[StagingStep, ...]:
        """The entry on every planned node, its paths rendered for that node."""
        return tuple(StagingStep(self.rendered(at.values(r)), r, n.name, at.tp) for r, n in enumerate(at.nodes))

    def rendered(self, values: dict[str, str]) -> Entry:
        src = render(self.src, values) if self.src else None
        return self.model_copy(update={"src": src, "dst": render(self.dst, values)})

    def mount(self, at: Planning, node: Node) -> tuple[str, str] | None:
        """``(host, container path)``: what this entry mounts read-only into every docker rank on
        node (in place of any other mount at that path), or None."""
        return None

    def fields(self) -> dict[str, Any]:
        """The kind's own keys, as ``plan --json`` shows them."""
        return self.model_dump(exclude=set(COMMON))


@dataclass(frozen=True)
class StagingStep:
    """One staging action on one node: its kind's entry with the paths rendered for the node."""

    entry: Entry
    rank: int
    node: str
    tp: int = 1

    @property
    def id(self) -> str:
        return self.entry.id

    @property
    def kind(self) -> str:
        return self.entry.kind

    @property
    def src(self) -> str | None:
        return self.entry.src

    @property
    def dst(self) -> str:
        return self.entry.dst

    @property
    def min_free(self) -> int:
        return self.entry.min_free

    def json(self) -> dict[str, Any]:
        """The step in ``plan --json``."""
        return {"id": self.id, "kind": self.kind, "rank": self.rank, "node": self.node, "src": self.src,
                "dst": self.dst, "tp": self.tp, "min_free": self.min_free, **self.entry.fields()}  # fmt: skip
