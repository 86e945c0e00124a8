"""``[composed_model]``: a per-node model directory built from Hugging Face snapshots (symlinked)
plus node-local files (hard-linked over them: a local file wins at the same name). One step per
node and source; the first source is the one the model path points at."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from sparkfleet.config.templates import node_values, render
from sparkfleet.plan.staging.base import Entry, Planning, StagingStep

if TYPE_CHECKING:
    from sparkfleet.config.cluster import Node


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ComposedSource(_Strict):
    """A Hugging Face repo whose snapshot is symlinked into the composed directory."""

    repo: str
    revision: str | None = None


class ComposedLocalFile(_Strict):
    """A node-local file hard-linked over the snapshot (it wins at the same name)."""

    host: str
    name: str | None = None


class ComposedModel(_Strict):
    """``[composed_model]``: a per-node model directory built from snapshots plus local files."""

    mount: str
    dir: str | None = None
    sources: tuple[ComposedSource, ...] = Field(min_length=1)
    local_files: tuple[ComposedLocalFile, ...] = ()

    def dir_on(self, node: Node, deployment: str) -> str:
        """Where the composed model directory lives on node."""
        if self.dir:
            return render(self.dir, node_values(node, 0, deployment))
        return f"{node.state_dir}/composed/{deployment}"

    def steps(self, at: Planning) -> tuple[StagingStep, ...]:
        return tuple(
            StagingStep(Composed(
                src=f"{node.hf_cache}/hub/models--{source.repo.replace('/', '--')}",
                dst=self.dir_on(node, at.deployment), repo=source.repo, revision=source.revision or at.revision,
                local_files=tuple(render(f.host, at.values(rank)) for f in self.local_files), primary=index == 0,
            ), rank, node.name, at.tp)
            for rank, node in enumerate(at.nodes)
            for index, source in enumerate(self.sources)
        )  # fmt: skip


class Composed(Entry):
    """One source of the composed directory on one node (planned from ``[composed_model]``)."""

    written: ClassVar[bool] = False
    kind: Literal["composed"] = "composed"
    id: str = "composed_model"
    repo: str
    revision: str | None = None
    local_files: tuple[str, ...] = ()
    primary: bool = True  # the source the model path points at
