"""TCP reachability of peers' fabric addresses, tried from one node (the head).

A refused connection still proves the address answers; only a timeout or "no route" means
unreachable. Uses bash's /dev/tcp so nothing beyond bash and coreutils' timeout is needed.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass


def command(targets: Sequence[tuple[str, int]], timeout_s: float = 2.0) -> list[str]:
    """The argv that prints `ip port exit-code error` per target."""
    parts = []
    for ip, port in targets:
        probe = shlex.quote(f"exec 3<>/dev/tcp/{ip}/{port}")
        parts.append(
            f'e=$(timeout {timeout_s:g} bash -c {probe} 2>&1); echo "{ip} {port} $? $(echo "$e" | tail -n 1)"'
        )
    return ["sh", "-c", "; ".join(parts) + "; true"]


@dataclass(frozen=True)
class Reach:
    """Whether ip:port answered from the probing node."""

    ip: str
    port: int
    reachable: bool
    detail: str
    tested: bool = True


def parse(stdout: str) -> tuple[Reach, ...]:
    """Parse the output of `command`."""
    out = []
    for line in stdout.splitlines():
        words = line.split(" ", 3)
        if len(words) < 3:
            continue
        ip, port, rc = words[0], int(words[1]), int(words[2])
        detail = words[3].strip() if len(words) > 3 else ""
        if rc == 127:  # no bash or timeout on the probing node: nothing was tried
            out.append(Reach(ip=ip, port=port, reachable=False, detail=f"not tested: {detail}", tested=False))
            continue
        refused = "refused" in detail.lower()
        if refused:
            detail = "answers (connection refused)"
        if rc == 0:
            detail = "connected"
        elif rc == 124:
            detail = "timed out"
        out.append(Reach(ip=ip, port=port, reachable=rc == 0 or refused, detail=detail))
    return tuple(out)
