"""TCP reachability of peers' fabric addresses, tried from one node (the head).

A refused connection still proves the address answers; only a timeout or "no route" means
unreachable. One bash process tries every target at once through /dev/tcp (nothing beyond
bash and coreutils' timeout is needed); a target still hanging when the timeout ends the
script printed nothing, and counts as timed out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkfleet.doctor.probes.bundle import ProbeOutput
from sparkfleet.doctor.probes.fact import Asked, Fact, section

_SCRIPT = (
    'for tgt in "$@"; do ( ip=${tgt%:*}; port=${tgt##*:}; '
    'e=$( { exec 3<>"/dev/tcp/$ip/$port"; } 2>&1 ); rc=$?; '
    'echo "$ip $port $rc ${e##*: }" ) & done; wait'
)


def command(targets: Sequence[tuple[str, int]], timeout_s: float = 2.0) -> list[str]:
    """The argv that prints `ip port exit-code error` per target that finished in time."""
    return ["timeout", f"{timeout_s:g}", "bash", "-c", _SCRIPT, "reach", *(f"{ip}:{port}" for ip, port in targets)]


@dataclass(frozen=True)
class Reach:
    """Whether ip:port answered from the probing node (`tested` False: nothing was tried)."""

    ip: str
    port: int
    reachable: bool
    detail: str
    tested: bool = True


def parse(
    stdout: str, targets: Sequence[tuple[str, int]] = (), exit_code: int = 0, stderr: str = ""
) -> tuple[Reach, ...]:
    """Parse the output of `command`; targets that printed nothing timed out."""
    if exit_code in (126, 127):  # no bash or no timeout on the probing node
        why = stderr.strip().splitlines()[-1] if stderr.strip() else "bash or timeout missing"
        return tuple(Reach(ip, port, False, f"not tested: {why}", tested=False) for ip, port in targets)
    found: dict[tuple[str, int], Reach] = {}
    for line in stdout.splitlines():
        words = line.split(" ", 3)
        if len(words) < 3:
            continue
        ip, port, rc = words[0], int(words[1]), int(words[2])
        detail = words[3].strip() if len(words) > 3 else ""
        refused = "refused" in detail.lower()
        if rc == 0:
            detail = "connected"
        elif refused:
            detail = "answers (connection refused)"
        found[(ip, port)] = Reach(ip=ip, port=port, reachable=rc == 0 or refused, detail=detail)
    for ip, port in targets:
        found.setdefault((ip, port), Reach(ip, port, False, "timed out"))
    return tuple(found.values())


def _parse_asked(outs: Mapping[str, ProbeOutput], asked: Asked) -> tuple[Reach, ...]:
    out = section(outs, "reach")
    return parse(out.stdout, asked.req.reach_targets, out.exit_code, out.stderr)


FACT = Fact("reach", lambda req: {"reach": command(req.reach_targets)} if req.reach_targets else {}, _parse_asked, ())
