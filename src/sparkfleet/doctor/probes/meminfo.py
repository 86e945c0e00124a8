"""`/proc/meminfo`: on unified-memory nodes MemAvailable is the GPU memory budget."""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.doctor.probes.fact import fixed

COMMAND = ["cat", "/proc/meminfo"]


@dataclass(frozen=True)
class MemInfo:
    """Figures in bytes."""

    total: int
    available: int
    free: int
    cached: int


def parse(stdout: str) -> MemInfo:
    """Parse /proc/meminfo (values in kB, i.e. KiB)."""
    values: dict[str, int] = {}
    for line in stdout.splitlines():
        key, _, rest = line.partition(":")
        words = rest.split()
        if not words:
            continue
        scale = 1024 if len(words) > 1 and words[1] == "kB" else 1
        values[key.strip()] = int(words[0]) * scale
    if "MemTotal" not in values:
        raise ValueError("no MemTotal line: not /proc/meminfo output")
    return MemInfo(
        total=values["MemTotal"],
        available=values.get("MemAvailable", values.get("MemFree", 0)),
        free=values.get("MemFree", 0),
        cached=values.get("Cached", 0),
    )


FACT = fixed("meminfo", COMMAND, lambda out: parse(out.stdout))
