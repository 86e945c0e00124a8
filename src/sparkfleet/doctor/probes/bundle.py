"""Run several probe commands on one node in one shell round trip, and split their outputs.

Each probe's stdout, stderr and exit status come back separately, framed by marker lines; a
command missing on the node exits 127 inside the shell, the same over SSH as locally.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkfleet.nodes.transport.base import Result, Transport

_BEGIN = "@@SF-BEGIN"
_ERR = "@@SF-ERR"
_END = "@@SF-END"

# Every probe runs at once in the background, its streams in files and its frame lines
# written with printf (a builtin: no process); then one `cat` prints frame, stdout, frame,
# stderr, frame for each probe in order. A slow probe (docker) costs its own time only.
_PRELUDE = (
    't=$(mktemp -d 2>/dev/null || { mkdir -p "/tmp/sfprobe.$$" && echo "/tmp/sfprobe.$$"; })\n'
    'sfp() { n=$1; shift; "$@" >"$t/$n.o" 2>"$t/$n.e" </dev/null; rc=$?; '
    f'printf \'\\n{_BEGIN} %s %s\\n\' "$n" "$rc" >"$t/$n.1"; '
    f'printf \'\\n{_ERR} %s\\n\' "$n" >"$t/$n.2"; '
    f'printf \'\\n{_END} %s\\n\' "$n" >"$t/$n.3"; }}\n'
)


@dataclass(frozen=True)
class ProbeOutput:
    """What one probe command printed on one node."""

    name: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def missing(self) -> bool:
        """The command does not exist on the node (the shell's 127)."""
        return self.exit_code == 127


def bundle_script(probes: Mapping[str, Sequence[str]]) -> str:
    """A POSIX sh script that runs every probe argv concurrently and frames their outputs."""
    lines = [_PRELUDE]
    for name, argv in probes.items():
        if not name.replace("_", "").isalnum():
            raise ValueError(f"probe name {name!r} must be alphanumeric")
        lines.append(f"sfp {name} {shlex.join(argv)} &\n")
    lines.append("wait\n")
    files = " ".join(f'"$t/{n}.1" "$t/{n}.o" "$t/{n}.2" "$t/{n}.e" "$t/{n}.3"' for n in probes)
    lines.append(f"cat {files}\n")
    lines.append('rm -rf "$t"\n')
    return "".join(lines)


def parse_bundle(stdout: str) -> dict[str, ProbeOutput]:
    """Split the framed output of `bundle_script` back into one ProbeOutput per probe."""
    out: dict[str, ProbeOutput] = {}
    pos = 0
    while True:
        start = stdout.find(f"\n{_BEGIN} ", pos)
        if start < 0:
            return out
        head_end = stdout.find("\n", start + 1)
        words = stdout[start + 1 : head_end].split(" ")
        if head_end < 0 or len(words) != 3 or not words[2].lstrip("-").isdigit():
            return out  # truncated output (a killed script): keep what came whole
        _, name, rc = words
        err_mark = f"\n{_ERR} {name}\n"
        end_mark = f"\n{_END} {name}\n"
        err_at = stdout.find(err_mark, head_end)
        end_at = stdout.find(end_mark, err_at) if err_at >= 0 else -1
        if end_at < 0:
            return out
        out[name] = ProbeOutput(
            name=name,
            exit_code=int(rc),
            stdout=stdout[head_end + 1 : err_at],
            stderr=stdout[err_at + len(err_mark) : end_at],
        )
        pos = end_at + len(end_mark) - 1


def run_bundle(
    transport: Transport, probes: Mapping[str, Sequence[str]], *, timeout: float = 20.0
) -> tuple[Result, dict[str, ProbeOutput]]:
    """Run the probes on the transport's node; the Result tells whether the node answered."""
    result = transport.run(["sh", "-c", bundle_script(probes)], timeout=timeout, check=False)
    return result, parse_bundle(result.stdout)
