"""Writing recipe and cluster TOML by hand, with the comments an imported file needs.

A TOML library would drop comments, and the comments (where a value came from, what to fill
in, what was not carried over) are half of what an importer hands the user.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")

Scalar = str | int | float | bool


def key(name: str) -> str:
    """A TOML key: bare when it can be, quoted otherwise."""
    return name if _BARE_KEY.match(name) else json.dumps(name)


def value(item: Any) -> str:
    """A TOML value for a string, number, bool, date-free list or mapping (as an inline table).

    YAML's null has no TOML spelling: it is written as the empty string ``""``, and callers that
    must tell the two apart keep nulls out (see ``typed``)."""
    if item is None:
        return '""'
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int | float):
        return repr(item)
    if isinstance(item, str):
        # JSON string escapes are valid TOML basic-string escapes.
        return json.dumps(item, ensure_ascii=False)
    if isinstance(item, Mapping):
        return "{" + ", ".join(f"{key(str(k))} = {value(v)}" for k, v in item.items()) + "}"
    if isinstance(item, Sequence):
        return "[" + ", ".join(value(v) for v in item) + "]"
    return json.dumps(str(item), ensure_ascii=False)


def typed(item: Any) -> str:
    """A value for a comment line: TOML for what TOML can hold, ``null`` for YAML's null."""
    return "null" if item is None else value(item)


class TomlDoc:
    """An append-only TOML document: key/values, tables, arrays of tables and comments."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def comment(self, text: str = "") -> None:
        """One or more comment lines (text may hold newlines)."""
        for line in text.splitlines() or [""]:
            self._lines.append(f"# {line}".rstrip())

    def blank(self) -> None:
        self._lines.append("")

    def set(self, name: str, item: Any, note: str | None = None) -> None:
        """``name = value``, with an optional trailing comment."""
        line = f"{key(name)} = {value(item)}"
        self._lines.append(f"{line}  # {note}" if note else line)

    def words(self, name: str, groups: Iterable[tuple[Sequence[str], str | None]], note: str | None = None) -> None:
        """A list of strings written one group per line (a flag and its value), with comments."""
        if note:
            self.comment(note)
        self._lines.append(f"{key(name)} = [")
        for group, group_note in groups:
            line = "    " + " ".join(value(w) + "," for w in group)
            self._lines.append(f"{line}  # {group_note}" if group_note else line)
        self._lines.append("]")

    def table(self, name: str) -> None:
        self._lines.append(f"[{name}]")

    def array_table(self, name: str) -> None:
        self._lines.append(f"[[{name}]]")

    def text(self) -> str:
        return "\n".join(self._lines).rstrip() + "\n"
