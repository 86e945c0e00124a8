"""The Transport interface: run a command on one node, put and get files.

Commands are data (a list of words) until the edge: a transport quotes them once, with
``shlex.join``, if it needs a shell at all.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from sparkfleet.errors import CommandError

_TAIL_LINES = 20


@dataclass(frozen=True)
class Result:
    """What one command did on one node."""

    node: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def display(self) -> str:
        """The command as a shell would show it (for messages)."""
        return shlex.join(self.argv)

    def tail(self, lines: int = _TAIL_LINES) -> str:
        """The last lines of stderr (or stdout when stderr is empty)."""
        text = self.stderr.strip() or self.stdout.strip()
        return "\n".join(text.splitlines()[-lines:])

    def check(self, what: str | None = None) -> Result:
        """Return self, or raise CommandError naming the command and its output tail."""
        if not self.ok:
            raise CommandError(self, what)
        return self


@runtime_checkable
class Transport(Protocol):
    """Runs commands on, and moves files to and from, one node."""

    node: str

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
    ) -> Result:
        """Run argv on the node; raise CommandError when check and it fails."""
        ...

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        """Copy a local file to a path on the node (atomically: temp file then rename)."""
        ...

    def put_bytes(self, data: bytes, remote: str, *, mode: int | None = None) -> None:
        """Write bytes to a path on the node (atomically)."""
        ...

    def get(self, remote: str, local: Path) -> None:
        """Copy a file from the node to a local path."""
        ...

    def stream(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start argv and return the process, stdout and stderr merged into one pipe."""
        ...

    def close(self) -> None:
        """Release connections (a no-op for local)."""
        ...
