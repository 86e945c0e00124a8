"""Run commands on this machine, with no shell in between."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sparkfleet.errors import TransportError
from sparkfleet.nodes.transport.base import Capabilities, ProcessStream, Result, Transport, run_here


class LocalTransport(Transport):
    """The node is this machine."""

    capabilities = Capabilities(local=True)

    def __init__(self, node: str = "local") -> None:
        self.node = node

    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None,
             env: dict[str, str] | None) -> Result:  # fmt: skip
        proc, seconds = run_here(self.node, argv, stdin, timeout, shown=argv[0],
                                 missing=f"{argv[0]}: command not found",
                                 env={**os.environ, **env} if env else None)  # fmt: skip
        return Result.of(self.node, argv, proc, seconds)

    def put_bytes(self, data: bytes, remote: str, *, mode: int | None = None) -> None:
        target = Path(remote)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, remote: str, local: Path) -> None:
        try:
            shutil.copyfile(remote, local)
        except OSError as exc:
            raise TransportError(self.node, f"cannot read {remote}: {exc.strerror}") from exc

    def stream(self, argv: Sequence[str], *, stdin: bool = False, merge_stderr: bool = True) -> ProcessStream:
        """Start argv here; a handle on its output (and its stdin with ``stdin=True``)."""
        return ProcessStream(self.node, argv, stdin=stdin, merge_stderr=merge_stderr)
