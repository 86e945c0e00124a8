"""Free space at a path: `df -B1 --output=source,fstype,size,avail,target`.

A staging `dst` usually does not exist yet, so the command walks up to the nearest existing
parent first (the filesystem that will hold it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sparkfleet.doctor.probes.bundle import ProbeOutput
from sparkfleet.doctor.probes.fact import Asked, Fact, read

FIELDS = "source,fstype,size,avail,target"


def command(path: str) -> list[str]:
    """The argv that prints df's line for the filesystem that holds (or will hold) path."""
    script = f'p="$1"; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done; df -B1 --output={FIELDS} "$p"'
    return ["sh", "-c", script, "df", path]


@dataclass(frozen=True)
class DiskFree:
    """The filesystem under a path; sizes in bytes."""

    source: str
    fstype: str
    size: int
    avail: int
    mount: str


def parse(stdout: str) -> DiskFree:
    """Parse df's output (header line, then one line per filesystem; the first is used)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if len(lines) < 2 or not lines[0].startswith("Filesystem"):
        raise ValueError("not df --output output")
    words = lines[1].split(None, 4)
    return DiskFree(source=words[0], fstype=words[1], size=int(words[2]), avail=int(words[3]), mount=words[4])


def _parse_each(outs: Mapping[str, ProbeOutput], asked: Asked) -> tuple[tuple[str, DiskFree | None], ...]:
    """Every asked path with its filesystem; None (and a note) where its df said nothing readable."""
    paths = enumerate(asked.req.disk_paths)
    return tuple((path, read(outs, f"disk{i}", lambda out: parse(out.stdout), asked)) for i, path in paths)


FACT = Fact(
    "disks", lambda req: {f"disk{i}": command(p) for i, p in enumerate(req.disk_paths)}, _parse_each, default=()
)
