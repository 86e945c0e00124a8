"""Ways to run commands and move files on a node: ``local``, ``ssh``, and ``mock`` for tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from sparkfleet.config.cluster import Node
from sparkfleet.nodes.transport.base import Capabilities, Stream, Transport
from sparkfleet.nodes.transport.local import LocalTransport
from sparkfleet.nodes.transport.ssh import SshTransport, control_dir

# Makes the Transport of a node: transport_for by default; tests pass MockTransports.
Connector = Callable[[Node], Transport]

__all__ = ["Capabilities", "Connector", "Stream", "Transport", "connected", "controller", "transport_for"]


def controller() -> Transport:
    """This machine, the controller, as a node (where a sync from a controller path reads)."""
    return LocalTransport("controller")


def transport_for(node: Node, *, accept_new_host_keys: bool = False) -> Transport:
    """The Transport that reaches node: local for this machine, ssh otherwise."""
    if node.transport == "local":
        return LocalTransport(node.name)
    control_dir()  # the master sockets' folder checked before anything is started or sent
    return SshTransport(node, accept_new_host_keys=accept_new_host_keys)


@contextmanager
def connected(nodes: Iterable[Node], *, accept_new_host_keys: bool = False,
              key: Callable[[Node], str] = lambda n: n.name) -> Iterator[dict[str, Transport]]:  # fmt: skip
    """A Transport per node (keyed by its name, or by key), each closed on the way out."""
    transports = {key(n): transport_for(n, accept_new_host_keys=accept_new_host_keys) for n in nodes}
    try:
        yield transports
    finally:
        for transport in transports.values():
            transport.close()
