"""The NFS server side of a node, as commands and facts: whether it can export, and exporting
(``apply/staging/nfs.py`` decides what to export to whom, and says what is wrong)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from sparkfleet.nodes.transport.base import Result, Transport

EXPORTS_DIR = "/etc/exports.d"


def as_root(argv: Sequence[str]) -> list[str]:
    """argv as root: itself when the login is root, else through ``sudo -n`` (never a prompt)."""
    return ["sh", "-c", 'if [ "$(id -u)" = 0 ]; then exec "$@"; else exec sudo -n "$@"; fi', "sh", *argv]


def has_exportfs(transport: Transport) -> bool:
    """The node has the NFS server's ``exportfs``."""
    probe = ["sh", "-c", "command -v exportfs || ls /usr/sbin/exportfs"]
    return transport.run(probe, check=False, timeout=60).ok


def parse_nfsd_threads(text: str | None) -> int | None:
    """The kernel NFS server's thread count from /proc/fs/nfsd/threads (None: not there)."""
    if text is None or not text.strip().isdigit():
        return None
    return int(text)


def nfsd_threads(transport: Transport) -> int | None:
    """How many nfsd threads serve (None: /proc/fs/nfsd is not mounted, no kernel NFS server)."""
    result = transport.run(["cat", "/proc/fs/nfsd/threads"], check=False, timeout=60)
    return parse_nfsd_threads(result.stdout if result.ok else None)


def write_exports(transport: Transport, name: str, line: str) -> Result:
    """Write ``/etc/exports.d/NAME.exports`` holding line (as root)."""
    target = f"{EXPORTS_DIR}/{name}.exports"
    return transport.run(as_root(["sh", "-c", f"mkdir -p {EXPORTS_DIR} && cat > {shlex.quote(target)}"]),
                         stdin=line.encode(), check=False, timeout=60)  # fmt: skip


def reload_exports(transport: Transport) -> tuple[Result, Result]:
    """``exportfs -ra`` then ``exportfs -v`` (the export table as the kernel has it now)."""
    return (transport.run(as_root(["exportfs", "-ra"]), check=False, timeout=120),
            transport.run(as_root(["exportfs", "-v"]), check=False, timeout=60))  # fmt: skip
