"""The nodes of a deployment as Transports, and running one function on all of them at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from sparkfleet.cluster import Node
from sparkfleet.errors import SparkfleetError
from sparkfleet.transport.base import Transport
from sparkfleet.transport.local import LocalTransport
from sparkfleet.transport.ssh import SshTransport

T = TypeVar("T")


def transport_for(node: Node, *, accept_new_host_keys: bool = False) -> Transport:
    """The Transport that reaches node: local for this machine, ssh otherwise."""
    if node.transport == "local":
        return LocalTransport(node.name)
    return SshTransport(node, accept_new_host_keys=accept_new_host_keys)


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What one node's call returned, or the error it raised."""

    node: str
    value: T | None
    error: BaseException | None

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(nodes: Iterable[str], fn: Callable[[str], T], *, workers: int = 16) -> dict[str, Outcome[T]]:
    """Call fn(node) for every node in parallel; a per-node map of results or errors."""
    names = list(nodes)

    def call(name: str) -> Outcome[T]:
        try:
            return Outcome(name, fn(name), None)
        except Exception as exc:
            return Outcome(name, None, exc)

    if len(names) <= 1:
        return {n: call(n) for n in names}
    with ThreadPoolExecutor(max_workers=min(workers, len(names))) as pool:
        return dict(zip(names, pool.map(call, names), strict=True))


def raise_first(outcomes: dict[str, Outcome[T]]) -> dict[str, T]:
    """The values, or the first node's error (user-facing ones as they are)."""
    for outcome in outcomes.values():
        if outcome.error is not None:
            if isinstance(outcome.error, SparkfleetError):
                raise outcome.error
            raise SparkfleetError(f"{outcome.node}: {outcome.error}") from outcome.error
    return {name: o.value for name, o in outcomes.items()}  # type: ignore[misc]
