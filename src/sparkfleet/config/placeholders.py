"""``<SET ME: what>`` placeholders: values an importer could not derive.

They are plain strings, so an imported recipe or cluster file still loads and can be read back;
``validate`` and ``plan`` (and so ``up`` and the exporters) refuse one while any remain, naming
every key that still holds one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from sparkfleet.config.validation import key_path

PATTERN = re.compile(r"<SET ME: [^>]*>")


def placeholder(what: str) -> str:
    """A clearly marked value the user must fill in."""
    return f"<SET ME: {what}>"


def _locations(value: Any, loc: tuple[int | str, ...]) -> Iterator[tuple[int | str, ...]]:
    if isinstance(value, str):
        if PATTERN.search(value):
            yield loc
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _locations(item, (*loc, str(key)))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _locations(item, (*loc, i))


def placeholder_keys(data: Any) -> list[str]:
    """The key paths (``env.X``, ``args[3]``, ``nodes[0].fabric_ip``) whose value holds a placeholder."""
    return [key_path(loc) for loc in _locations(data, ())]
