"""Comma-separated numbers on the command line: ``1,2,4`` or ``4k,16k`` (k = 1024)."""

from __future__ import annotations

from sparkfleet.errors import SparkfleetError


def parse_int_list(text: str, what: str, error: type[SparkfleetError], *, minimum: int = 1) -> tuple[int, ...]:
    """The numbers in text, each at least minimum; one clear ``error`` line otherwise."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        mult = 1024 if part.endswith("k") else 1
        num = part[:-1] if part.endswith("k") else part
        if not num.isdigit() or int(num) < minimum:
            kind = "positive integers" if minimum > 0 else "integers"
            raise error(f"bad {what} {part!r}: give {kind} separated by commas, e.g. 1,2,4 or 1k,2k")
        out.append(int(num) * mult)
    if not out:
        raise error(f"no {what} given")
    return tuple(out)
