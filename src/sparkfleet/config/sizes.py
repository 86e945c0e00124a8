"""Human sizes ("55G", "32gb", "512MiB") to bytes and back."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes in a size such as ``55G``, ``32gb`` or ``1.5TiB`` (binary units, as docker reads them)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"{text} is negative")
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a size like 55G")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def format_size(num: float) -> str:
    """A short binary size: ``1.5 GiB``."""
    value = float(num)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _size(value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


# A size a user writes in a recipe: a number of bytes, or text such as "55G".
Size = Annotated[int, BeforeValidator(_size)]
