"""A session on a node's ssh master, asked for over the master's control socket (OpenSSH's
PROTOCOL.mux) by this process itself, instead of by a new ``ssh`` client.

An ``ssh`` client costs this machine ~6 ms of CPU before it does anything (its libraries and
OpenSSL's start-up; ``ssh -V`` alone takes that on the 2-core test VM), and all a client does
once a master is up is what this module does: hello, "new session" with the command, then its
stdin, stdout and stderr handed over as descriptors, so the master moves the bytes to and from
this process's pipes directly. ``up`` and ``down`` open a session per node, so on 16 nodes the
clients were ~0.1 s of this machine's CPU.

Only for a master that is already up: without one, ``connect`` fails at once and the caller
starts the ssh client, which checks the host key, opens the connection and leaves the master.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading

from sparkfleet.errors import TransportTimeout
from sparkfleet.nodes.transport.base import PipeStream

MUX_VERSION = 4
MUX_MSG_HELLO = 0x00000001
MUX_C_NEW_SESSION = 0x10000002
MUX_S_PERMISSION_DENIED = 0x80000002
MUX_S_FAILURE = 0x80000003
MUX_S_EXIT_MESSAGE = 0x80000004
MUX_S_SESSION_OPENED = 0x80000006
MUX_S_TTY_ALLOC_FAIL = 0x80000008
NO_ESCAPE = 0xFFFFFFFF
# Exit code of a session the master could not open or lost, as the ssh client reports it.
LOST = 255


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _packet(*parts: bytes) -> bytes:
    body = b"".join(parts)
    return struct.pack(">I", len(body)) + body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _recv_packet(sock: socket.socket) -> tuple[int, bytes]:
    """One packet from the master: its type and the rest of its body."""
    (length,) = struct.unpack(">I", _recv_exact(sock, 4))
    body = _recv_exact(sock, length)
    return struct.unpack(">I", body[:4])[0], body[4:]


def _forwarded_env() -> list[bytes]:
    """LANG and LC_*, which the ssh client sends by the usual default (``SendEnv LANG LC_*``);
    sshd keeps only what its ``AcceptEnv`` allows."""
    return [f"{k}={v}".encode() for k, v in os.environ.items() if k == "LANG" or k.startswith("LC_")]


class MuxStream(PipeStream):
    """A Stream over a session of the master listening at ``control_path`` (see the module)."""

    def __init__(self, node: str, control_path: str, command: str, *, stdin: bool, merge_stderr: bool,
                 shown: str) -> None:  # fmt: skip
        self.node, self._shown = node, shown
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(control_path)  # no master there: OSError at once, the caller falls back
        except OSError:
            self._sock.close()
            raise
        theirs: list[int] = []
        ours: list[int] = []
        try:
            if stdin:
                in_r, in_w = os.pipe()
                theirs.append(in_r)
                ours.append(in_w)
            else:
                theirs.append(os.open(os.devnull, os.O_RDONLY))
            out_r, out_w = os.pipe()
            ours.append(out_r)
            theirs.append(out_w)
            if merge_stderr:
                theirs.append(os.dup(out_w))
            else:
                err_r, err_w = os.pipe()
                ours.append(err_r)
                theirs.append(err_w)
            session = struct.pack(">II", MUX_C_NEW_SESSION, 1) + _string(b"") + struct.pack(
                ">IIIII", 0, 0, 0, 0, NO_ESCAPE  # no tty, no X11, no agent, not a subsystem
            )  # fmt: skip
            env = b"".join(_string(e) for e in _forwarded_env())
            # Sent without waiting for the master's answers (read by _watch): the master reads
            # exactly one packet at a time, then the three descriptors, as from its own client.
            self._sock.sendall(_packet(struct.pack(">II", MUX_MSG_HELLO, MUX_VERSION))
                               + _packet(session, _string(b""), _string(command.encode()), env))  # fmt: skip
            for fd in theirs:
                socket.send_fds(self._sock, [b"\0"], [fd])
        except OSError:
            for fd in ours:
                os.close(fd)
            self._sock.close()
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        stdin_file = os.fdopen(ours.pop(0), "wb") if stdin else None
        stdout_file = os.fdopen(ours.pop(0), "rb")
        self._hold(stdin_file, stdout_file, os.fdopen(ours.pop(0), "rb") if not merge_stderr else None)
        self._why = ""
        self._code: int | None = None
        self._done = threading.Event()
        threading.Thread(target=self._watch, name=f"ssh-mux-{node}", daemon=True).start()

    def _watch(self) -> None:
        """The master's answers: its hello, the session opened (or why not), its exit code."""
        # As the ssh client: no exit status (a command killed by a signal, or the master gone)
        # is 255, with nothing on stderr that reads as a failure to connect.
        code, why = LOST, "no exit status from the node (the command was killed, or the ssh master went away)"
        try:
            kind, body = _recv_packet(self._sock)
            if kind != MUX_MSG_HELLO or struct.unpack(">I", body[:4])[0] != MUX_VERSION:
                why = "ssh: the master speaks another multiplexing protocol"
                return
            kind, body = _recv_packet(self._sock)
            if kind in (MUX_S_PERMISSION_DENIED, MUX_S_FAILURE):
                (length,) = struct.unpack(">I", body[4:8])
                why = f"ssh: session request failed: {body[8 : 8 + length].decode(errors='replace')}"
                return
            if kind != MUX_S_SESSION_OPENED:
                why = f"ssh: unexpected answer {kind:#x} from the master"
                return
            while True:
                kind, body = _recv_packet(self._sock)
                if kind == MUX_S_EXIT_MESSAGE:
                    code, why = struct.unpack(">II", body[:8])[1], ""
                    return
        except (OSError, EOFError, struct.error):
            pass
        finally:
            self._code, self._why = code, why
            with contextlib.suppress(OSError):
                self._sock.close()
            self._done.set()

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise TransportTimeout(self.node, self._shown, timeout or 0)
        assert self._code is not None
        return self._code

    @property
    def exit_code(self) -> int | None:
        return self._code if self._done.is_set() else None

    def errors(self) -> str:
        return super().errors() + (f"{self._why}\n" if self._why and self._done.is_set() else "")

    def close(self) -> None:
        """End the session: a control connection that closes makes the master end it, as when
        an ssh client is killed."""
        self.close_stdin()
        if not self._done.is_set():
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._done.wait(10)
        # stdout stays open: a reader thread drains what is left and sees the end.


MUX_C_OPEN_FWD = 0x10000006
MUX_S_OK = 0x80000001
MUX_FWD_LOCAL = 1
PORT_STREAMLOCAL = 0xFFFFFFFE  # -2 as the protocol's uint32: the "host" is a unix socket path


def open_forward(control_path: str, local: str, remote: str, *, timeout: float = 5.0) -> None:
    """Ask the master for ``-L local:remote`` between unix sockets (as ``ssh -O forward``): each
    connection to ``local`` on this machine becomes one to ``remote`` on the node, carried by
    the master's connection with no process started on either side. OSError when refused."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(control_path)
        request = struct.pack(">III", MUX_C_OPEN_FWD, 1, MUX_FWD_LOCAL) + _string(local.encode())
        request += struct.pack(">I", PORT_STREAMLOCAL) + _string(remote.encode()) + struct.pack(">I", PORT_STREAMLOCAL)
        sock.sendall(_packet(struct.pack(">II", MUX_MSG_HELLO, MUX_VERSION)) + _packet(request))
        try:
            _recv_packet(sock)  # the master's hello
            kind, body = _recv_packet(sock)
        except (EOFError, struct.error) as exc:
            raise OSError("the ssh master closed the control connection") from exc
        if kind != MUX_S_OK:
            reason = body[8 : 8 + struct.unpack(">I", body[4:8])[0]].decode(errors="replace") if len(body) >= 8 else ""
            raise OSError(f"the ssh master refused the forward: {reason or hex(kind)}")


class SocketStream(PipeStream):
    """A Stream over a connection to a forwarded unix socket (a node's resident agent): its
    input and output are the connection's two directions; there is no stderr and no exit code
    (0 once closed)."""

    def __init__(self, node: str, sock: socket.socket, shown: str) -> None:
        self.node, self._shown, self._sock = node, shown, sock
        self._hold(sock.makefile("wb"), sock.makefile("rb"), None)
        self._closed = threading.Event()

    def close_stdin(self) -> None:
        super().close_stdin()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)  # the agent reads the end of its input

    def wait(self, timeout: float | None = None) -> int:
        if not self._closed.wait(timeout):
            raise TransportTimeout(self.node, self._shown, timeout or 0)
        return 0

    @property
    def exit_code(self) -> int | None:
        return 0 if self._closed.is_set() else None

    def close(self) -> None:
        self.close_stdin()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._closed.set()
