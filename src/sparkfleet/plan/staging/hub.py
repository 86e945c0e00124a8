"""The Hub fetch: the recipe's Hugging Face model brought onto the source node of the ``sync``
entry that distributes its repo folder (``src`` ending in ``models--ORG--NAME``, with a
``source_node``), before distribution copies it node to node. Only what the engine loads
(``profile``: ``("safetensors", None)`` or ``("gguf", model_file)``, the rules of
nodes/shipped/hub_fetch.py), into that node's cache (``dst``, the folder holding the repo)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from sparkfleet.config.templates import render
from sparkfleet.plan.staging.base import Entry, Planning, StagingStep
from sparkfleet.plan.staging.sync import Sync


class Hub(Entry):
    written: ClassVar[bool] = False
    kind: Literal["hub"] = "hub"
    id: str = "hub"
    repo: str
    revision: str | None = None
    profile: tuple[str, str | None] = ("safetensors", None)


def steps(repo: str, profile: tuple[str, str | None], entries: Sequence[Entry],
          at: Planning) -> tuple[StagingStep, ...]:  # fmt: skip
    """The fetch onto the source node of the sync that distributes repo's folder, if one does."""
    folder = "models--" + repo.replace("/", "--")
    for entry in entries:
        if isinstance(entry, Sync) and entry.source_node and entry.src and entry.src.rstrip("/").endswith("/" + folder):
            if entry.source_node not in (n.name for n in at.nodes):
                return ()  # the plan names it
            rank = at.rank_of(entry.source_node)
            cache = render(entry.src, at.values(rank)).rstrip("/").rsplit("/", 1)[0]
            return (StagingStep(Hub(dst=cache, repo=repo, revision=at.revision, profile=profile), rank,
                                entry.source_node, at.tp),)  # fmt: skip
    return ()
