"""A node whose commands are answered by a function (httpx's ``MockTransport``), for unit tests
of everything above the Transport without sshd or dockerd:

    transport = MockTransport("node0", lambda call: 0 if call.argv == ("true",) else (1, "", "no"))

A streamed command is answered when it starts: its output is the answer's stdout (then stderr,
when merged); what is written to its stdin is kept in ``stream.written``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from sparkfleet.errors import TransportError
from sparkfleet.nodes.transport.base import CHUNK, Capabilities, Result, Transport


@dataclass(frozen=True)
class Call:
    """One command as the node received it (``put`` writes arrive as ``("put", path)``)."""

    node: str
    argv: tuple[str, ...]
    stdin: bytes | None = None


# An exit code; stdout (exit 0); (exit code, stdout, stderr); or a whole Result.
Answer = int | str | tuple[int, str, str] | Result
Handler = Callable[[Call], Answer]


class MockTransport(Transport):
    """Answers every command with handler(call); keeps the calls and the files put."""

    def __init__(self, node: str, handler: Handler, capabilities: Capabilities | None = None) -> None:
        self.node = node
        self.handler = handler
        # A scripted node is neither this machine nor reached over SSH, unless a test says so.
        self._capabilities = capabilities or Capabilities()
        self.calls: list[Call] = []
        self.files: dict[str, bytes] = {}

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None,
             env: dict[str, str] | None) -> Result:  # fmt: skip
        call = Call(self.node, argv, stdin)
        self.calls.append(call)
        return _result(self.node, argv, self.handler(call))  # the handler may raise TransportError: an unreachable node

    def put_bytes(self, data: bytes, remote: str, *, mode: int | None = None) -> None:
        call = Call(self.node, ("put", remote), data)
        self.calls.append(call)
        self.handler(call)
        self.files[remote] = data

    def get(self, remote: str, local: Path) -> None:
        if remote not in self.files:
            raise TransportError(self.node, f"cannot read {remote}: no such file")
        Path(local).write_bytes(self.files[remote])

    def stream(self, argv: Sequence[str], *, stdin: bool = False, merge_stderr: bool = True) -> ScriptedStream:
        call = Call(self.node, tuple(argv), None)
        self.calls.append(call)
        result = _result(self.node, call.argv, self.handler(call))
        return ScriptedStream(self.node, result, merge_stderr=merge_stderr)


class ScriptedStream:
    """A streamed command whose whole output was known when it started."""

    def __init__(self, node: str, result: Result, *, merge_stderr: bool = True) -> None:
        self.node = node
        self.result = result
        out = result.stdout + (result.stderr if merge_stderr else "")
        self._out = out.encode()
        self._err = "" if merge_stderr else result.stderr
        self._done = False
        self.written = bytearray()
        self.closed = False

    def __iter__(self) -> Iterator[str]:
        data, self._out = self._out, b""
        self._done = True
        yield from data.decode(errors="replace").splitlines()

    def read(self, size: int = CHUNK) -> bytes:
        chunk, self._out = self._out[:size], self._out[size:]
        self._done = not self._out
        return chunk

    def write(self, data: bytes) -> None:
        self.written += data

    def close_stdin(self) -> None:
        return None

    def wait(self, timeout: float | None = None) -> int:
        self._done = True
        return self.result.exit_code

    @property
    def exit_code(self) -> int | None:
        return self.result.exit_code if self._done else None

    def errors(self) -> str:
        return self._err

    def close(self) -> None:
        self.closed = self._done = True

    def __enter__(self) -> ScriptedStream:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.close()


def _result(node: str, argv: tuple[str, ...], answer: Answer) -> Result:
    if isinstance(answer, Result):
        return answer
    if isinstance(answer, int):
        return Result(node, argv, answer, "", "", 0.0)
    if isinstance(answer, str):
        return Result(node, argv, 0, answer, "", 0.0)
    code, out, err = answer
    return Result(node, argv, code, out, err, 0.0)
