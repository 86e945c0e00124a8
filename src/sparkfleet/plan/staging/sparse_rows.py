"""``sparse-rows``: each rank's rows of a checkpoint's large embedding tables, packed on the
rank's own node from the snapshot at ``src`` into ``dst`` (nodes/shipped/sparse_rows.py); later
stages check sampled row hashes against the ledger and repack only what changed."""

from __future__ import annotations

from typing import Literal

from sparkfleet.plan.staging.base import Entry


class SparseRows(Entry):
    kind: Literal["sparse-rows"] = "sparse-rows"
    layout: Literal["packed", "sparse-file"] = "packed"
    tables: tuple[str, ...] = ("*.engram.embed.weight",)

    def problem(self) -> str | None:
        return None if self.src else "kind = 'sparse-rows' needs src (the snapshot to pack rows from)"
