"""``{{name}}`` templates in recipe values: found at load time, filled per rank at plan time."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkfleet.config.cluster import Node

KNOWN = ("hf", "node", "rank", "home", "state", "name")
_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def unknown_templates(text: str) -> list[str]:
    """The template names in text that sparkfleet does not know."""
    return [name for name in _TEMPLATE.findall(text) if name not in KNOWN]


def render(text: str, values: Mapping[str, str]) -> str:
    """Replace every ``{{name}}`` with its value (names were checked at load time)."""
    return _TEMPLATE.sub(lambda m: values[m.group(1)], text)


def node_values(node: Node, rank: int, deployment: str) -> dict[str, str]:
    """What each template means for a rank on node in deployment."""
    return {"hf": node.hf_cache.rstrip("/"), "node": node.name, "rank": str(rank), "home": node.home,
            "state": node.state_dir, "name": deployment}  # fmt: skip
