"""What an import produced and what it could not carry over: placeholders and skipped keys.

Placeholders are strings of the form ``<SET ME: what>`` (see sparkfleet.config.placeholders): the
written recipe still loads, and ``validate``/``plan`` refuse it until every one is filled in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sparkfleet.config.placeholders import PATTERN, placeholder
from sparkfleet.importers.toml_text import TomlDoc

__all__ = ["ImportResult", "Note", "comment_block", "has_placeholders", "placeholder"]


def has_placeholders(text: str) -> list[str]:
    """Every placeholder in text."""
    return PATTERN.findall(text)


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
