"""A model snapshot in a Hugging Face cache: every file (symlinks followed) with its size."""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.doctor.probes.fact import Fact, section


def snapshots_dir(hf_cache: str, repo: str) -> str:
    """`<hf_cache>/hub/models--org--name/snapshots` for a repo id `org/name`."""
    return f"{hf_cache.rstrip('/')}/hub/models--{repo.replace('/', '--')}/snapshots"


def command(hf_cache: str, repo: str) -> list[str]:
    """The argv that lists every revision's files as `path<TAB>size`, sorted."""
    script = (
        'for d in "$1"/*/; do [ -d "$d" ] || continue; echo "## $(basename "$d")"; '
        "find -L \"$d\" -type f -printf '%P\\t%s\\n' 2>/dev/null | LC_ALL=C sort; done; true"
    )
    return ["sh", "-c", script, "snapshot", snapshots_dir(hf_cache, repo)]


@dataclass(frozen=True)
class Snapshot:
    """One revision's files: (relative path, size in bytes), sorted."""

    revision: str
    files: tuple[tuple[str, int], ...]


def parse(stdout: str) -> tuple[Snapshot, ...]:
    """Parse the output of `command` (no revisions: an empty tuple)."""
    snaps: list[Snapshot] = []
    rev = ""
    files: list[tuple[str, int]] = []
    for line in stdout.splitlines():
        if line.startswith("## "):
            if rev:
                snaps.append(Snapshot(rev, tuple(files)))
            rev, files = line[3:].strip(), []
        elif "\t" in line and rev:
            path, _, size = line.rpartition("\t")
            files.append((path, int(size)))
    if rev:
        snaps.append(Snapshot(rev, tuple(files)))
    return tuple(snaps)


FACT = Fact(
    "snapshots",
    lambda req: {"snapshot": command(req.hf_cache, req.model_repo)} if req.hf_cache and req.model_repo else {},
    lambda outs, _asked: parse(section(outs, "snapshot").stdout),
)
