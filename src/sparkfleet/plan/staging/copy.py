"""``copy``: small files (tuning tables, chat templates) pushed into the folder ``dst`` on every
node and checked by hash there; ``files`` are relative to the recipe's folder, or all the files of
the folder ``src``."""

from __future__ import annotations

from typing import Literal

from sparkfleet.plan.staging.base import Entry


class Copy(Entry):
    kind: Literal["copy"] = "copy"
    files: tuple[str, ...] = ()

    def problem(self) -> str | None:
        return None if self.files or self.src else "kind = 'copy' needs files = [...] (or src, a folder of files)"
