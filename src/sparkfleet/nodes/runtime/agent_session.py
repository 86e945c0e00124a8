"""One process agent per node, kept open for the length of a sparkfleet command.

A one-shot agent call costs a new SSH channel, a shell and an interpreter on the node and an ssh
client here; `up` makes three to four calls per node (preflight, start, readiness, the head's
probe) and `down` three. On 16 nodes that sharing of cores was most of `up`'s growth over 4. A
session opens on the first call (``… serve``: JSON requests and answers, one line each) and
answers every later call on the same transport in about a millisecond. It closes when its
transport is dropped; the node's agent ends when its stdin does.

The one-shot call stays: for transports that cannot hold a stream open (``capabilities.sessions``
false: local, scripted), for a second caller while the session is busy (ranks of one node start
in parallel), and when the session never came up — then the one-shot call reports why (no such
python, a refused login) the way it always has. A session that dies in the middle of a call
raises: the command may have run there, so it is not sent again.

Over SSH a session also makes sure the node has its resident agent (``serve KEY IDLE``, see
``nodes/shipped/process_agent.py``) and has the ssh master forward to its socket; the next
command's session is a connection to that forward, which costs the node a fork of an agent that
is already loaded instead of a shell and an interpreter. A forward whose agent has gone ends
before the agent's hello: nothing was delivered, and the session becomes an SSH one.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any, cast

from sparkfleet.errors import RankRuntimeError, SparkfleetError
from sparkfleet.nodes.ship import PROCESS_AGENT, loader_text, shipped_argv
from sparkfleet.nodes.transport.base import ResidentCarrier, Stream, Transport, trace

# How long a node's resident agent waits for the next connection before it exits: as long as
# the ssh master that forwards to it stays up without a command (ssh.PERSIST_S).
RESIDENT_IDLE_S = 300


class AgentSession:
    """A serving process agent on one node (see the module's doc)."""

    def __init__(self, transport: Transport, python: str) -> None:
        self.node = transport.node
        # Weak: the transport's finalizer closes this session, and would never run while the
        # session held the transport.
        self._transport: weakref.ref[Transport] = weakref.ref(transport)
        self._python = python
        self._lock = threading.Lock()
        self.serving = False  # the agent said hello
        self.pid: int | None = None  # the agent's pid on the node, from its hello
        self.closed = False
        self._key = ""
        stream: Stream | None = None
        if transport.capabilities.resident:
            carrier = cast(ResidentCarrier, transport)
            self._key = carrier.resident_key(f"{python}\0{loader_text(PROCESS_AGENT)}")
            stream = carrier.open_resident(self._key)
        # A forward that connected stays as it is when its agent has gone: the master keeps
        # one per socket name, and a new resident listens where the old one did.
        self._via_resident = self._forwarded = stream is not None
        self._attach(stream or self._session_stream())

    def _session_stream(self) -> Stream:
        serve = ["serve", self._key, str(RESIDENT_IDLE_S)] if self._key else ["serve"]
        transport = self._transport()
        if transport is None:
            raise OSError("the session's transport was closed")
        return transport.stream(shipped_argv(self._python, PROCESS_AGENT, serve), stdin=True,
                                      merge_stderr=False)  # fmt: skip

    def _attach(self, stream: Stream) -> None:
        self._stream = stream
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream, self._lines), name=f"agent-session-{self.node}",
                         daemon=True).start()  # fmt: skip

    @staticmethod
    def _read(stream: Stream, lines: queue.Queue[str | None]) -> None:
        try:
            for line in stream:
                lines.put(line)
        except (OSError, ValueError):  # the stream was closed under the reader
            pass
        finally:
            lines.put(None)

    def _next(self, deadline: float) -> str | None:
        try:
            return self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError from None

    def acquire(self) -> bool:
        """Take the session for one call, or False when another call holds it."""
        return not self.closed and self._lock.acquire(blocking=False)

    def release(self) -> None:
        self._lock.release()

    def _fall_back(self) -> bool:
        """The resident agent did not answer (gone after its idle time, or never started): use
        a session of the node's own, which starts a resident for the next command. Nothing was
        delivered, so the request goes again. False when this session was one already."""
        if not self._via_resident:
            return False
        self._via_resident = False
        self._stream.close()
        try:
            self._attach(self._session_stream())
        except (OSError, SparkfleetError):
            return False  # the caller's one-shot call reports what is wrong with the node
        return True

    def _send(self, request: bytes) -> bool:
        while True:
            try:
                self._stream.write(request)
                return True
            except (OSError, ValueError):  # the agent is gone: nothing was delivered
                if not self._fall_back():
                    self.close()
                    return False

    def _hello(self, request: bytes, deadline: float) -> bool:
        """Wait for the agent's hello (anything a login shell prints comes before it)."""
        while not self.serving:
            line = self._next(deadline)
            if line is None:
                if self._fall_back() and self._send(request):
                    continue
                self.close()
                return False  # it never served, so it never read the request
            if line.startswith('{"serving"'):
                hello = json.loads(line)
                self.serving, self.pid = True, int(hello["serving"])
                carrier = cast("ResidentCarrier | None", self._transport())
                if hello.get("resident") and not self._forwarded and carrier is not None:
                    # The node started (or has) its resident agent: later commands go there.
                    with contextlib.suppress(OSError, SparkfleetError):
                        carrier.forward_resident(self._key, hello["resident"])
        return True

    def call(self, command: str, payload: dict[str, object], stdin: bytes | None,
             timeout: float) -> dict[str, Any] | None:  # fmt: skip
        """The agent's answer; None when the command was never delivered (the caller makes the
        one-shot call instead). Hold the session (``acquire``) around it."""
        started, deadline = time.time(), time.monotonic() + timeout
        request = json.dumps({"command": command, "payload": payload,
                              "stdin": stdin.decode() if stdin else None}).encode() + b"\n"  # fmt: skip
        if not self._send(request):
            return None
        try:
            if not self._hello(request, deadline):
                return None
            line = self._next(deadline)
        except TimeoutError:
            self.close()
            why = f"process agent {command} gave no answer within {timeout:.0f} s"
            raise RankRuntimeError(self.node, why) from None
        trace("ssh-agent", self.node, started, time.time(), command)
        if line is None:
            self.close()
            raise RankRuntimeError(self.node, f"process agent {command} failed: its session ended: "
                                   f"{self._stream.errors().strip()[-500:]}")  # fmt: skip
        reply = json.loads(line)
        if "error" in reply:
            raise RankRuntimeError(self.node, f"process agent {command} failed: {reply['error'].strip()}")
        answer: dict[str, Any] = reply["answer"]
        return answer

    def close(self) -> None:
        """End the agent's input; it exits, and so does the ssh client carrying it."""
        self.closed = True
        self._stream.close_stdin()


# Per transport: its sessions by python, and the lock under which they are opened. Each node's
# is opened under its own lock: starting the ssh client takes ~10 ms, and one lock for all nodes
# queued the 16 nodes' openings one behind another (0.19 s of a 16-node `up`).
_sessions: weakref.WeakKeyDictionary[Transport, tuple[dict[str, AgentSession], threading.Lock]] = (
    weakref.WeakKeyDictionary()
)
_guard = threading.Lock()


def session_for(transport: Transport, python: str, *, open_one: bool = True) -> AgentSession | None:
    """The transport's session for this python: opened on first use (unless ``open_one`` is
    false: a caller that would only save a cheap shell call uses one that is already open);
    None where the transport cannot hold one or its session never came up."""
    if not transport.capabilities.sessions:
        return None
    with _guard:
        per, opening = _sessions.setdefault(transport, ({}, threading.Lock()))
    with opening:
        session = per.get(python)
        if session is not None and not session.closed:
            return session
        if (session is not None and not session.serving) or not open_one:
            return None  # one that never came up is not tried again: one-shot calls from here on
        session = per[python] = AgentSession(transport, python)
        weakref.finalize(transport, session.close)
        return session


def call_in_session(transport: Transport, python: str, command: str, payload: dict[str, object], *,
                    stdin: bytes | None = None, timeout: float = 30,
                    open_one: bool = True) -> dict[str, Any] | None:  # fmt: skip
    """The agent's answer through the transport's session; None when there is none to use (no
    session, a busy one, one that never came up): the caller then makes its own call."""
    session = session_for(transport, python, open_one=open_one)
    if session is None or not session.acquire():
        return None
    try:
        return session.call(command, payload, stdin, timeout)
    finally:
        session.release()


def open_sessions(transports: Mapping[str, Transport], pythons: Mapping[str, str]) -> None:
    """Open each node's session now; returns once the ssh clients are started, about a
    millisecond each (the agents' hellos are read by their first calls).

    For a command that still has code to load before its first node call: the nodes' agents
    boot (an SSH handshake where no master connection is up yet, an interpreter) while this
    process loads, instead of after it. Opened here, not from a thread: one that competed with
    the imports for the GIL took 16 ms a node. A session that does not come up is found by its
    first call, which then reports why as it always has."""
    for node, transport in transports.items():
        with contextlib.suppress(SparkfleetError, OSError):  # its first call finds and reports it
            session_for(transport, pythons[node])
