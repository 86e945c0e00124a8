"""Run commands on a node over the system OpenSSH client, with one multiplexed master connection
per node (ControlPersist). The user's ``~/.ssh/config``, keys and known_hosts apply."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sparkfleet.config.cluster import Node
from sparkfleet.errors import TransportError
from sparkfleet.nodes.private import private_dir
from sparkfleet.nodes.transport.base import (
    Capabilities,
    ProcessStream,
    Result,
    Stream,
    Transport,
    display_command,
    run_here,
    trace,
)

SSH_FAILED = 255
# Lines ssh itself prints when it could not get a session (as opposed to the remote command's).
_SSH_ERROR = re.compile(
    r"(ssh: |Connection (refused|timed out|closed)|Permission denied|Host key verification failed|"
    r"Could not resolve|No route to host|kex_exchange|Connection reset|banner exchange)"
)
PERSIST_S = 300
_NO_SSH = "the ssh client is not installed on this machine"


def control_dir() -> Path:
    """A short, private directory for master sockets (unix socket paths max out at 108 bytes)."""
    return private_dir(Path(tempfile.gettempdir()) / f"sparkfleet-ssh-{os.getuid()}")


class SshTransport(Transport):
    """The node is reached with ``ssh``; every call reuses the node's master connection."""

    def __init__(self, node: Node, *, accept_new_host_keys: bool = False) -> None:
        self.node = node.name
        self._node = node
        self._accept_new = accept_new_host_keys

    @property
    def capabilities(self) -> Capabilities:
        """Another machine, reached with the ssh words of ``ssh_argv``."""
        return Capabilities(local=False, ssh=tuple(self.ssh_argv()), sessions=True)

    def control_path(self) -> str:
        """This node's master socket, named by a digest of how the node is reached (host, port,
        user, key, host-key policy, and the ssh config's path, size and mtime). The address alone
        would hand a command to a master opened for another inventory that once used it (a
        re-imaged node): a session on the wrong machine, its host key never checked."""
        n = self._node
        config = n.ssh_config or os.path.expanduser("~/.ssh/config")
        try:
            st = os.stat(config)
            seen: tuple[int, int] | None = (st.st_size, st.st_mtime_ns)
        except OSError:
            seen = None
        how = "\0".join(str(x) for x in (n.ssh_config, n.ssh_key, n.user, n.ssh_port, n.host, self._accept_new, seen))
        return f"{control_dir()}/{hashlib.sha256(how.encode()).hexdigest()[:32]}"

    @property
    def destination(self) -> str:
        """``user@host:port`` for messages."""
        user = f"{self._node.user}@" if self._node.user else ""
        port = f":{self._node.ssh_port}" if self._node.ssh_port else ""
        return f"{user}{self._node.host}{port}"

    def ssh_argv(self) -> list[str]:
        """The ssh words up to and including the destination (also used for rsync's -e)."""
        n = self._node
        words = ["ssh"]
        if n.ssh_config:
            words += ["-F", n.ssh_config]
        words += [
            "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=10",
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self.control_path().replace('%', '%%')}",
            "-o", f"ControlPersist={PERSIST_S}",
            "-o", "ServerAliveInterval=10",
            "-o", "ServerAliveCountMax=3",
        ]  # fmt: skip
        if self._accept_new:
            words += ["-o", "StrictHostKeyChecking=accept-new"]
        if n.ssh_port:
            words += ["-p", str(n.ssh_port)]
        if n.ssh_key:
            words += ["-i", n.ssh_key, "-o", "IdentitiesOnly=yes"]
        if n.user:
            words += ["-l", n.user]
        words += ["--", n.host]  # the destination can never be read as an option (cluster.py checks it too)
        return words

    def _command(self, argv: Sequence[str], env: dict[str, str] | None) -> list[str]:
        remote = shlex.join(argv)
        if env:
            remote = shlex.join(["env", *(f"{k}={v}" for k, v in env.items())]) + " " + remote
        return [*self.ssh_argv(), remote]

    def _exec(self, argv: Sequence[str], stdin: bytes | None, timeout: float | None,
              env: dict[str, str] | None) -> tuple[subprocess.CompletedProcess[bytes], float]:  # fmt: skip
        if not argv:
            raise ValueError("empty command")
        wall = time.time()
        proc, seconds = run_here(self.node, self._command(argv, env), stdin, timeout,
                                 shown=display_command(argv, 120), where=self.destination,
                                 missing=_NO_SSH)  # fmt: skip
        trace("ssh", self.node, wall, time.time(), shlex.join(argv))
        if proc.returncode == SSH_FAILED and _SSH_ERROR.search(proc.stderr.decode(errors="replace")):
            last = proc.stderr.decode(errors="replace").strip().splitlines()[-1]
            raise TransportError(self.node, f"cannot reach {self.destination} over SSH: {last}")
        return proc, seconds

    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None,
             env: dict[str, str] | None) -> Result:  # fmt: skip
        return Result.of(self.node, argv, *self._exec(argv, stdin, timeout, env))

    def put_bytes(self, data: bytes, remote: str, *, mode: int | None = None) -> None:
        # umask 077 first: a secret env file is never readable by others, not even briefly.
        script = (
            'umask 077; d=$(dirname "$1"); mkdir -p "$d" && t="$1.partial.$$" && cat > "$t" && '
            + (f'chmod {mode:o} "$t" && ' if mode is not None else "")
            + 'mv -f "$t" "$1"'
        )
        self.run(["sh", "-c", script, "sh", remote], stdin=data)

    def get(self, remote: str, local: Path) -> None:
        proc, _ = self._exec(["cat", remote], None, None, None)
        if proc.returncode != 0:
            raise TransportError(self.node, f"cannot read {remote}: {proc.stderr.decode(errors='replace').strip()}")
        Path(local).write_bytes(proc.stdout)

    def stream(self, argv: Sequence[str], *, stdin: bool = False, merge_stderr: bool = True) -> Stream:
        """Start argv on the node over the master connection (an ssh client opens it where none
        is up); a handle on its output (and its stdin with ``stdin=True``)."""
        now = time.time()
        trace("ssh-stream", self.node, now, now, shlex.join(argv))
        # Its own session, as run's: Ctrl-C goes to sparkfleet, which closes what it opened
        # (an agent session must outlive the Ctrl-C that starts up's rollback).
        return ProcessStream(self.node, self._command(argv, None), stdin=stdin, merge_stderr=merge_stderr,
                             shown=display_command(argv, 120), new_session=True, missing=_NO_SSH)  # fmt: skip
