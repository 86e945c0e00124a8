"""Free space at a path: `df -B1 --output=source,fstype,size,avail,target`.

A staging `dst` usually does not exist yet, so the command walks up to the nearest existing
parent first (the filesystem that will hold it).
"""

from __future__ import annotations

from dataclasses import dataclass

FIELDS = "source,fstype,size,avail,target"


def command(path: str) -> list[str]:
    """The argv that prints df's line for the filesystem that holds (or will hold) path."""
    script = (
        'p="$1"; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done; '
        f'df -B1 --output={FIELDS} "$p"'
    )
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
