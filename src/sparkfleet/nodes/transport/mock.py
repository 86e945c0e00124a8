"""A node whose commands are answered by a function: httpx's ``MockTransport``, for nodes.

For unit tests of everything above the Transport (up, rollback, readiness, status, down)
without sshd or dockerd. The real-fleet tests stay for the real paths.

    def node(call: Call) -> Answer:
        if call.argv == ("true",):
            return 0
        return 1, "", "no such command"

    transport = MockTransport("node0", node)
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkfleet.errors import TransportError
from sparkfleet.nodes.transport.base import Result


@dataclass(frozen=True)
class Call:
    """One command as the node received it (``put`` writes arrive as ``("put", path)``)."""

    node: str
    argv: tuple[str, ...]
    stdin: bytes | None = None


# An exit code; stdout (exit 0); (exit code, stdout, stderr); or a whole Result.
Answer = int | str | tuple[int, str, str] | Result
Handler = Callable[[Call], Answer]


class MockTransport:
    """Answers every command with handler(call); keeps the calls and the files put."""

    def __init__(self, node: str, handler: Handler) -> None:
        self.node = node
        self.handler = handler
        self.calls: list[Call] = []
        self.files: dict[str, bytes] = {}

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
    ) -> Result:
        call = Call(self.node, tuple(argv), stdin)
        self.calls.append(call)
        answer = self.handler(call)  # may raise TransportError: an unreachable node
        result = _result(self.node, call.argv, answer)
        return result.check() if check else result

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        self.put_bytes(Path(local).read_bytes(), remote, mode=mode)

    def put_bytes(self, data: bytes, remote: str, *, mode: int | None = None) -> None:
        call = Call(self.node, ("put", remote), data)
        self.calls.append(call)
        self.handler(call)
        self.files[remote] = data

    def get(self, remote: str, local: Path) -> None:
        if remote not in self.files:
            raise TransportError(self.node, f"cannot read {remote}: no such file")
        Path(local).write_bytes(self.files[remote])

    def stream(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        raise TransportError(self.node, "MockTransport does not stream; answer the command with run()")

    def close(self) -> None:
        return None


def _result(node: str, argv: tuple[str, ...], answer: Answer) -> Result:
    if isinstance(answer, Result):
        return answer
    if isinstance(answer, int):
        return Result(node, argv, answer, "", "", 0.0)
    if isinstance(answer, str):
        return Result(node, argv, 0, answer, "", 0.0)
    code, out, err = answer
    return Result(node, argv, code, out, err, 0.0)
