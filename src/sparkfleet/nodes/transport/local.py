"""Run commands on this machine, with no shell in between."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sparkfleet.errors import TransportError, TransportTimeout
from sparkfleet.nodes.transport.base import Capabilities, ProcessStream, Result

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
        full_env = {**os.environ, **env} if env else None
        start = time.monotonic()
        try:
            proc = subprocess.run(
                words,
                input=stdin if stdin is not None else b"",
                capture_output=True,
                # Ctrl-C at the terminal goes to sparkfleet only: a command in flight finishes
                # (or times out) instead of dying half-way, and up's rollback decides what stops.
                start_new_session=True,
                timeout=timeout,
                env=full_env,
                check=False,
            )
        except FileNotFoundError as exc:
            raise TransportError(self.node, f"{words[0]}: command not found") from exc
        except subprocess.TimeoutExpired as exc:
            raise TransportTimeout(self.node, words[0], timeout or 0) from exc
        result = Result(
            node=self.node,
            argv=words,
            exit_code=proc.returncode,
            stdout=proc.stdout.decode(errors="replace"),
            stderr=proc.stderr.decode(errors="replace"),
            duration=time.monotonic() - start,
        )
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
