"""Stopping a deployment's ranks in its engine's order (``RankHandle.stop_wave``): every rank of
one wave on every node at once, and the next wave only after that one is stopped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.runtime import runtime_for
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import RankHandle


@dataclass
class Stopped:
    """What was stopped, per rank, and the nodes that failed (with their error)."""

    stopped: list[str] = field(default_factory=list)
    failed: dict[str, BaseException] = field(default_factory=dict)


def stop_ranks(ranks: Sequence[RankHandle], transports: Mapping[str, Transport], deployment: str,
               instance: str | None, *, grace: float = 10.0) -> Stopped:  # fmt: skip
    """Stop ranks wave by wave on the nodes in transports. A node that fails in one wave is
    reported, and the later waves are still stopped: the rest must not be left running."""
    result = Stopped()
    for wave in sorted({r.stop_wave for r in ranks}):
        members = [r for r in ranks if r.stop_wave == wave and r.node.name in transports]

        def stop(node: str, members: list[RankHandle] = members) -> list[str]:
            out: list[str] = []
            for rank in (r for r in members if r.node.name == node):
                gone = runtime_for(rank).stop(rank, transports[node], deployment, instance, grace)
                out += [f"{node} rank {rank.rank}: {x}" for x in gone]
            return out

        for node, outcome in fan_out(list(dict.fromkeys(r.node.name for r in members)), stop).items():
            if outcome.ok:
                result.stopped += outcome.value or []
            else:
                result.failed.setdefault(node, outcome.error or RuntimeError("failed"))
    return result
