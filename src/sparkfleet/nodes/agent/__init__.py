"""The node agent (``nodes/shipped/agent.py``) from the controller's side; ``session.py`` keeps
one serving per node for the length of a command."""

from __future__ import annotations

import json

from sparkfleet.errors import RankRuntimeError
from sparkfleet.nodes.agent.session import session_for
from sparkfleet.nodes.identity import PortHolder
from sparkfleet.nodes.ship import NODE_AGENT, run_shipped
from sparkfleet.nodes.transport.base import Transport


def node_agent(transport: Transport, python: str, command: str, payload: dict[str, object], *,
               timeout: float = 30, stdin: bytes | None = None) -> dict:  # fmt: skip
    """Run one agent command on the node and return its JSON answer: over the node's agent
    session where there is one to use (not busy, came up), else as a call of its own."""
    session = session_for(transport, python)
    if session is not None and session.acquire():
        try:
            answer = session.call(command, payload, stdin, timeout)
        finally:
            session.release()
        if answer is not None:
            return answer
    result = run_shipped(transport, python, NODE_AGENT, [command, json.dumps(payload)], stdin=stdin,
                         timeout=timeout)  # fmt: skip
    if not result.ok:
        raise RankRuntimeError(transport.node, f"node agent {command} failed: {result.tail()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def port_holders(transport: Transport, python: str, ports: tuple[int, ...]) -> list[PortHolder]:
    """Who listens on these TCP ports of the node."""
    answer = node_agent(transport, python, "holders", {"ports": list(ports)}, timeout=30)
    return [PortHolder(**h) for h in answer["holders"]]
