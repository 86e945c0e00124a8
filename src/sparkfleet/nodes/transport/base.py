"""The Transport interface: run a command on one node, put and get files, stream a command.

Commands are lists of words until the edge, where a transport quotes them once if it needs a
shell. What it can do beyond that is in its ``capabilities`` (pyinfra's connector style), so
code above the seam never asks which class it holds.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from sparkfleet.errors import CommandError, TransportError, TransportTimeout

_TAIL_LINES = 20
CHUNK = 1 << 20
# A file that every node command (and up's readiness wait) is appended to, one tab-separated
# line each: kind, node, wall-clock start and end, the command's first words. Set by
# benchmarks/lifecycle_overhead.py to count round trips per node and split sparkfleet's own
# time from the engines' start-up; unset, tracing costs one dict lookup.
TRACE_ENV = "SPARKFLEET_TRACE"
_trace_lock = threading.Lock()


def display_command(argv: Sequence[str], limit: int | None = None) -> str:
    """The command for messages: a shell-quoted line, with a shipped program (one ``-c`` word of
    many kilobytes) named by its size instead of printed whole."""
    line = shlex.join(w if len(w) <= 200 else f"<{len(w)}-byte program>" for w in argv)
    return line if limit is None else line[:limit]


def trace(kind: str, node: str, started: float, ended: float, what: str) -> None:
    """Append one line to the trace file, when one is set (``time.time()`` stamps)."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = "\t".join((kind, node, f"{started:.6f}", f"{ended:.6f}", " ".join(what.split())[:80])) + "\n"
    with _trace_lock, open(path, "a", encoding="utf-8") as fh:
        fh.write(line)


@dataclass(frozen=True)
class Capabilities:
    """What a transport offers beyond run/put/get/stream.

    local: the node is this machine (its paths are the controller's, readable directly).
    ssh: the ssh words up to and including the destination, for tools that take an ssh command
        of their own (``rsync -e``, a node that pushes to this one); None when not over SSH.
    sessions: a stream with stdin may stay open for a whole command as the node's agent session
        (``nodes/agent/session.py``); its streams never get the terminal's Ctrl-C.
    """

    local: bool = False
    ssh: tuple[str, ...] | None = None
    sessions: bool = False


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
        return display_command(self.argv)

    def tail(self, lines: int = _TAIL_LINES) -> str:
        """The last lines of stderr (or stdout when stderr is empty)."""
        text = self.stderr.strip() or self.stdout.strip()
        return "\n".join(text.splitlines()[-lines:])

    @classmethod
    def of(cls, node: str, argv: Sequence[str], proc: subprocess.CompletedProcess[bytes], seconds: float) -> Result:
        return cls(node, tuple(argv), proc.returncode, proc.stdout.decode(errors="replace"),
                   proc.stderr.decode(errors="replace"), seconds)  # fmt: skip

    def check(self, what: str | None = None) -> Result:
        """Return self, or raise CommandError naming the command and its output tail."""
        if not self.ok:
            raise CommandError(self, what)
        return self


def run_here(node: str, command: Sequence[str], stdin: bytes | None, timeout: float | None, *, shown: str,
             missing: str, env: dict[str, str] | None = None, where: str | None = None,
             ) -> tuple[subprocess.CompletedProcess[bytes], float]:  # fmt: skip
    """Run command on this machine (a local command, or ssh carrying one to the node); what it
    did and its seconds. A timeout names the command as shown; missing is the error when the
    command's program is not installed here."""
    start = time.monotonic()
    try:
        proc = subprocess.run(
            list(command), input=stdin if stdin is not None else b"", capture_output=True,
            # Ctrl-C at the terminal goes to sparkfleet only: a command in flight finishes (or
            # times out) instead of dying half-way, and up's rollback decides what stops.
            start_new_session=True, timeout=timeout, env=env, check=False,
        )  # fmt: skip
    except FileNotFoundError as exc:
        raise TransportError(node, missing) from exc
    except subprocess.TimeoutExpired as exc:
        raise TransportTimeout(node, shown, timeout or 0, where) from exc
    return proc, time.monotonic() - start


class Stream(Protocol):
    """A command running on a node, read as it goes (a handle, never the process itself).

    Output is stdout, with stderr merged in unless the stream was opened with
    ``merge_stderr=False`` (then ``errors()`` has it once the command ended). With
    ``stdin=True``, ``write`` feeds the command and ``close_stdin`` ends its input.
    """

    node: str

    def __iter__(self) -> Iterator[str]:
        """The output's lines as they come (decoded, without the line break)."""

    def read(self, size: int = CHUNK) -> bytes:
        """The next chunk of output, as soon as any is there (b"" at the end)."""

    def write(self, data: bytes) -> None:
        """Feed the command's stdin (BrokenPipeError when it stopped reading)."""

    def close_stdin(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command to end; its exit code (TransportTimeout after timeout)."""

    @property
    def exit_code(self) -> int | None:
        """The exit code, or None while it runs."""

    def errors(self) -> str:
        """What the command wrote to stderr (separate stderr only; after it ended)."""

    def close(self) -> None:
        """Stop the command if it still runs, and release the pipes."""

    def __enter__(self) -> Stream: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...  # fmt: skip


class ProcessStream:
    """A Stream over a process started on this machine (a local command, or ssh to the node).
    Its stderr, unless merged into stdout, is read all along by a thread: a command that fills
    its stderr pipe would block otherwise. missing: the error when argv's program is not here."""

    def __init__(self, node: str, argv: Sequence[str], *, stdin: bool = False, merge_stderr: bool = True,
                 shown: str | None = None, new_session: bool = False, missing: str | None = None) -> None:  # fmt: skip
        self.node = node
        self._shown = shown or display_command(argv, 120)
        try:
            self._proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                start_new_session=new_session,
            )
        except FileNotFoundError as exc:
            raise TransportError(node, missing or f"{argv[0]}: command not found") from exc
        assert self._proc.stdout is not None
        self._stdin, self._stdout, stderr = self._proc.stdin, self._proc.stdout, self._proc.stderr
        self._err: list[bytes] = []
        self._err_reader: threading.Thread | None = None
        if stderr is not None:
            self._err_reader = threading.Thread(target=lambda: self._err.append(stderr.read()), daemon=True)
            self._err_reader.start()

    def __iter__(self) -> Iterator[str]:
        for raw in self._stdout:
            yield raw.decode(errors="replace").rstrip("\n")

    def read(self, size: int = CHUNK) -> bytes:
        return self._stdout.read1(size)  # type: ignore[attr-defined]

    def write(self, data: bytes) -> None:
        if self._stdin is None:
            raise TransportError(self.node, f"{self._shown}: opened without stdin")
        self._stdin.write(data)
        self._stdin.flush()  # a request waits for its answer: nothing may sit in the buffer

    def close_stdin(self) -> None:
        if self._stdin is not None:
            with contextlib.suppress(OSError):
                self._stdin.close()

    def errors(self) -> str:
        if self._err_reader is not None:
            self._err_reader.join()
        return b"".join(self._err).decode(errors="replace")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.close()

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise TransportTimeout(self.node, self._shown, timeout or 0) from exc

    @property
    def exit_code(self) -> int | None:
        return self._proc.poll()

    def close(self) -> None:
        self.close_stdin()
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        # stdout stays open: a reader thread drains what is left and sees the end.


class Transport(Protocol):
    """Runs commands on, and moves files to and from, one node. The transports subclass it for
    ``run``, ``put`` and ``close``, which are the same for all of them."""

    node: str

    @property
    def capabilities(self) -> Capabilities:
        """What this transport offers beyond the calls below."""

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
        result = self._run(tuple(argv), stdin, timeout, env)
        return result.check() if check else result

    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None,
             env: dict[str, str] | None) -> Result:  # fmt: skip
        """What ``run`` does, whatever the exit code."""

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        """Copy a local file to a path on the node (atomically: temp file then rename)."""
        self.put_bytes(Path(local).read_bytes(), remote, mode=mode)

    def put_bytes(self, data: bytes, remote: str, *, mode: int | None = None) -> None:
        """Write bytes to a path on the node (atomically)."""

    def get(self, remote: str, local: Path) -> None: ...

    def stream(self, argv: Sequence[str], *, stdin: bool = False, merge_stderr: bool = True) -> Stream:
        """Start argv and return a handle on it: its output as it comes, its stdin with
        ``stdin=True`` (following logs, piping an image or a tar stream through this machine)."""

    def close(self) -> None:
        """Release connections: none to release here, and ssh leaves the node's master running
        for the next sparkfleet command to reuse (ControlPersist)."""
        return None
