"""What an import produced and what it could not carry over: placeholders and skipped keys.

Placeholders are strings of the form ``<SET ME: what>``. They are plain strings, so the written
recipe still loads and plans (``sparkfleet plan`` shows them in place); ``has_placeholders``
lets a caller refuse to launch one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sparkfleet.importers.toml_text import TomlDoc

_PLACEHOLDER = re.compile(r"<SET ME: [^>]*>")


def placeholder(what: str) -> str:
    """A clearly marked value the user must fill in."""
    return f"<SET ME: {what}>"


def has_placeholders(text: str) -> list[str]:
    """Every placeholder in text (for ``up`` or a test to refuse an unfinished recipe)."""
    return _PLACEHOLDER.findall(text)


@dataclass(frozen=True)
class Note:
    """One key (or line) and what happened to it."""

    key: str
    detail: str


@dataclass(frozen=True)
class ImportResult:
    """The recipe written, an optional cluster file, and everything the user must look at."""

    recipe_toml: str
    cluster_toml: str | None = None
    placeholders: tuple[Note, ...] = ()
    not_carried: tuple[Note, ...] = ()
    not_understood: tuple[Note, ...] = ()


def comment_block(doc: TomlDoc, title: str, notes: Iterable[Note]) -> None:
    """A titled comment block listing notes, one per line (nothing when there are none)."""
    items = list(notes)
    if not items:
        return
    doc.blank()
    doc.comment(f"{title} ({len(items)}):")
    for note in items:
        doc.comment(f"  {note.key}: {note.detail}")
