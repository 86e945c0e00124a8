"""One node agent per node, kept open for the length of a sparkfleet command.

A one-shot agent call costs an SSH channel, a shell and an interpreter on the node; `up` makes
three to four per node and `down` three. A session opens on the first call (``… serve``: one
JSON line each way) and answers every later call in about a millisecond.

The one-shot call stays for transports without ``capabilities.sessions`` (local, scripted), for
a second caller while the session is busy, and when the session never came up (the one-shot
call then reports why). A session that dies mid-call raises: the command may have run there, so
it is not sent again. As Mitogen's remote interpreter, the agent lives and dies with its
connection: when the transport is dropped, the ssh client ends, then the agent's stdin, then it.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from sparkfleet.errors import RankRuntimeError, SparkfleetError
from sparkfleet.nodes.ship import NODE_AGENT, shipped_argv
from sparkfleet.nodes.transport.base import Stream, Transport, trace


class AgentSession:
    """A serving node agent on one node (see the module's doc)."""

    def __init__(self, transport: Transport, python: str) -> None:
        self.node = transport.node
        self._lock = threading.Lock()
        self.serving = False  # the agent said hello
        self.pid: int | None = None  # the agent's pid on the node, from its hello
        self.closed = False
        # The session holds no reference to its transport: the transport's finalizer closes it.
        self._stream = transport.stream(shipped_argv(python, NODE_AGENT, ["serve"]), stdin=True,
                                        merge_stderr=False)  # fmt: skip
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self._stream, self._lines), name=f"agent-session-{self.node}",
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

    def call(self, command: str, payload: dict[str, object], stdin: bytes | None,
             timeout: float) -> dict[str, Any] | None:  # fmt: skip
        """The agent's answer; None when the command was never delivered (the caller makes the
        one-shot call instead). Hold the session (``acquire``) around it."""
        started, deadline = time.time(), time.monotonic() + timeout
        request = json.dumps({"command": command, "payload": payload,
                              "stdin": stdin.decode() if stdin else None}).encode() + b"\n"  # fmt: skip
        try:
            self._stream.write(request)
        except (OSError, ValueError):  # the agent is gone: nothing was delivered
            self.close()
            return None
        try:
            while not self.serving:  # its hello (anything a login shell prints comes before it)
                line = self._next(deadline)
                if line is None:
                    self.close()
                    return None  # it never served, so it never read the request
                if line.startswith('{"serving"'):
                    self.serving, self.pid = True, int(json.loads(line)["serving"])
            line = self._next(deadline)
        except TimeoutError:
            self.close()
            why = f"node agent {command} gave no answer within {timeout:.0f} s"
            raise RankRuntimeError(self.node, why) from None
        trace("ssh-agent", self.node, started, time.time(), command)
        if line is None:
            self.close()
            raise RankRuntimeError(self.node, f"node agent {command} failed: its session ended: "
                                   f"{self._stream.errors().strip()[-500:]}")  # fmt: skip
        reply = json.loads(line)
        if "error" in reply:
            raise RankRuntimeError(self.node, f"node agent {command} failed: {reply['error'].strip()}")
        answer: dict[str, Any] = reply["answer"]
        return answer

    def close(self) -> None:
        """End the agent's input; it exits, and so does the ssh client carrying it."""
        self.closed = True
        self._stream.close_stdin()


# Per transport: its sessions by python, and the lock under which they are opened (one per node:
# a lock for all nodes queued their ssh clients' starts one behind another).
_sessions: weakref.WeakKeyDictionary[Transport, tuple[dict[str, AgentSession], threading.Lock]] = (
    weakref.WeakKeyDictionary()
)
_guard = threading.Lock()


def session_for(transport: Transport, python: str) -> AgentSession | None:
    """The transport's session for this python, opened on first use; None where the transport
    cannot hold one or its session never came up."""
    if not transport.capabilities.sessions:
        return None
    with _guard:
        per, opening = _sessions.setdefault(transport, ({}, threading.Lock()))
    with opening:
        session = per.get(python)
        if session is not None and not session.closed:
            return session
        if session is not None and not session.serving:
            return None  # one that never came up is not tried again: one-shot calls from here on
        session = per[python] = AgentSession(transport, python)
        weakref.finalize(transport, session.close)
        return session


def open_sessions(transports: Mapping[str, Transport], pythons: Mapping[str, str]) -> None:
    """Open each node's session now (about a millisecond each; the hellos are read by the first
    calls), so the agents boot while this process still loads code. Not from a thread: one that
    competed with the imports for the GIL took 16 ms a node."""
    for node, transport in transports.items():
        with contextlib.suppress(SparkfleetError, OSError):  # its first call finds and reports it
            session_for(transport, pythons[node])
