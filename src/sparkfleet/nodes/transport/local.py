"""Run commands on this machine, with no shell in between."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sparkfleet.errors import TransportError
from sparkfleet.nodes.transport.base import Capabilities, ProcessStream, Result, run_here

LOCAL = Capabilities(local=True)


class LocalTransport:
    """The node is this machine."""

    capabilities = LOCAL

    def __init__(self, node: str = "local") -> None:
        self.node = node

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
    ) -> Result:
        words = tuple(argv)
        proc, seconds = run_here(self.node, words, stdin, timeout, shown=words[0],
                                 missing=f"{words[0]}: command not found",
                                 env={**os.environ, **env} if env else None)  # fmt: skip
        result = Result.of(self.node, words, proc, seconds)
        return result.check() if check else result

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        self.put_bytes(Path(local).read_bytes(), remote, mode=mode)

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

    def close(self) -> None:
        return None
