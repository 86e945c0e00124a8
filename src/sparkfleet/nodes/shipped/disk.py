"""Free-space checks made before staging writes anything (node-side, stdlib only)."""

from __future__ import annotations

import os

from sparkfleet.nodes.shipped.failure import StageFailure


def existing_ancestor(path: str) -> str:
    """``path`` or its nearest existing parent (the filesystem a new file would land on)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return probe


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer can still use on the filesystem holding ``path``."""
    st = os.statvfs(existing_ancestor(path))
    return st.f_bavail * st.f_frsize


def allocated_bytes(path: str) -> int:
    """Disk blocks already allocated to ``path`` (0 if absent); holes do not count."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def human(n: int) -> str:
    """A byte count for messages in binary units, as recipes write sizes (``55G`` = 55 GiB)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def check_room(dst: str, min_free: int, to_write: int) -> None:
    """StageFailure unless ``dst`` has ``min_free`` plus ``to_write`` bytes free."""
    if to_write <= 0:
        return
    free = free_bytes(dst)
    needed = min_free + to_write
    if free < needed:
        raise StageFailure(
            f"not enough free space at {dst}: {human(free)} free, {human(needed)} needed "
            f"({human(to_write)} to write + min_free {human(min_free)})"
        )
