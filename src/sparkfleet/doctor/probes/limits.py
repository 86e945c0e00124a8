"""The locked-memory limit containers inherit: dockerd's own `Max locked memory` from
/proc/<pid>/limits (the login shell's when dockerd is not found). Docker refuses
`--ulimit memlock=-1` where that hard limit is lower."""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.doctor.probes.fact import fixed

COMMAND = [
    "sh",
    "-c",
    # dockerd's pid file first: pgrep scans all of /proc, slow on a busy node.
    "p=$(cat /var/run/docker.pid 2>/dev/null || pgrep -xo dockerd 2>/dev/null); "
    'if [ -n "$p" ] && [ -r "/proc/$p/limits" ]; then '
    'echo "## dockerd"; grep "^Max locked memory" "/proc/$p/limits"; '
    'else echo "## shell"; ulimit -H -l; fi',
]


@dataclass(frozen=True)
class MemlockLimit:
    """The hard limit in bytes (None: unlimited) and whose limit it is."""

    hard: int | None
    source: str

    def allows(self, setting: str | None) -> bool:
        """Whether a cluster `memlock` setting ("unlimited", bytes, "none"/None) fits under it."""
        if setting in (None, "", "none") or self.hard is None:
            return True
        if setting == "unlimited":
            return False
        return int(setting) <= self.hard


def parse(stdout: str) -> MemlockLimit:
    """Parse the output of `COMMAND`."""
    head, _, body = stdout.partition("\n")
    words = body.split()
    if head.strip() == "## dockerd":
        # "Max locked memory  <soft>  <hard>  bytes"
        hard = words[4] if len(words) >= 5 else "unlimited"
        return MemlockLimit(None if hard == "unlimited" else int(hard), "dockerd")
    if head.strip() == "## shell":
        value = words[0] if words else "unlimited"
        return MemlockLimit(None if value == "unlimited" else int(value) * 1024, "login shell (ulimit -H -l)")
    raise ValueError("not the limits probe's output")


FACT = fixed("memlock", COMMAND, lambda out: parse(out.stdout))
