"""``sync``: a Hugging Face snapshot (or any folder) at ``src`` copied into ``dst`` on every node,
from the controller or, with ``source_node``, from that node over the fabric; ``include`` and
``exclude`` are globs over the snapshot's paths."""

from __future__ import annotations

from typing import Literal

from sparkfleet.plan.staging.base import Entry


class Sync(Entry):
    kind: Literal["sync"] = "sync"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    source_node: str | None = None

    def problem(self) -> str | None:
        return None if self.src else "kind = 'sync' needs src (the folder to sync)"

    def named_nodes(self) -> dict[str, str]:
        return {"source_node": self.source_node} if self.source_node else {}
