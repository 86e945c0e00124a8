"""Everything doctor needs to know about one node, gathered in one round trip.

`FactsRequest` says what to ask (which image, which staging paths, which peers to try); each
fact in `FACTS` (one per probe module) gives its commands for it; the node answers them in one
bundled shell script; `parse_facts` hands each fact its outputs and fills NodeFacts.
A probe that failed or printed something unexpected leaves its field None and an entry in
`errors`, so one odd node never hides the others' results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sparkfleet.doctor.probes import (
    checkpoint,
    clock,
    disk,
    docker,
    gpu,
    limits,
    meminfo,
    netif,
    ports,
    rdma,
    reach,
    snapshot,
    user,
)
from sparkfleet.doctor.probes.bundle import ProbeOutput, run_bundle
from sparkfleet.doctor.probes.checkpoint import Checkpoint
from sparkfleet.doctor.probes.clock import Skew
from sparkfleet.doctor.probes.disk import DiskFree
from sparkfleet.doctor.probes.docker import DockerFacts, ImageFacts
from sparkfleet.doctor.probes.fact import Asked, Fact, FactsRequest, NoOutput, note_unread
from sparkfleet.doctor.probes.gpu import GpuFacts
from sparkfleet.doctor.probes.limits import MemlockLimit
from sparkfleet.doctor.probes.meminfo import MemInfo
from sparkfleet.doctor.probes.netif import NetFacts
from sparkfleet.doctor.probes.ports import ListeningPorts
from sparkfleet.doctor.probes.rdma import RdmaFacts
from sparkfleet.doctor.probes.reach import Reach
from sparkfleet.doctor.probes.snapshot import Snapshot
from sparkfleet.errors import SparkfleetError, TransportTimeout
from sparkfleet.nodes.transport.base import Transport

__all__ = ["FACTS", "FactsRequest", "NodeFacts", "collect", "parse_facts", "probe_commands"]

# Every fact doctor asks a node, each filling the NodeFacts field of its name.
FACTS: tuple[Fact, ...] = (
    user.FACT,
    clock.FACT,
    meminfo.FACT,
    gpu.FACT,
    rdma.FACT,
    netif.FACT,
    docker.DOCKER,
    docker.IMAGE,
    disk.FACT,
    ports.FACT,
    snapshot.FACT,
    reach.FACT,
    limits.FACT,
    docker.GPU_HOOK,
    checkpoint.FACT,
)


@dataclass(frozen=True)
class NodeFacts:
    """One node's facts; `reachable` False means nothing else could be asked."""

    node: str
    reachable: bool
    error: str = ""
    elapsed: float = 0.0
    user: str | None = None
    skew: Skew | None = None
    meminfo: MemInfo | None = None
    gpu: GpuFacts | None = None
    rdma: RdmaFacts | None = None
    net: NetFacts | None = None
    docker: DockerFacts | None = None
    image: ImageFacts | None = None
    disks: tuple[tuple[str, DiskFree | None], ...] = ()
    ports: ListeningPorts | None = None
    snapshots: tuple[Snapshot, ...] | None = None
    reach: tuple[Reach, ...] = ()
    memlock: MemlockLimit | None = None
    gpu_hook: bool | None = None
    checkpoint: Checkpoint | None = None
    errors: tuple[str, ...] = field(default=())

    @property
    def model_config(self) -> dict[str, Any] | None:
        return self.checkpoint[0] if self.checkpoint else None

    @property
    def tensors(self) -> dict[str, int] | None:
        return self.checkpoint[1] if self.checkpoint else None


def probe_commands(req: FactsRequest) -> dict[str, list[str]]:
    """The named probe commands for one node."""
    return {name: argv for fact in FACTS for name, argv in fact.commands(req).items()}


def parse_facts(node: str, outs: dict[str, ProbeOutput], req: FactsRequest, sent: float, received: float) -> NodeFacts:
    """NodeFacts from the bundle's outputs (pure)."""
    asked = Asked(req, sent, received)
    values: dict[str, Any] = {}
    for fact in FACTS:
        sections = fact.commands(req)
        if not sections:
            continue  # not asked of this node: the field keeps its default
        try:
            values[fact.name] = fact.parse(outs, asked)
        except (ValueError, KeyError, IndexError) as exc:
            note_unread(asked, outs, exc.args[0] if isinstance(exc, NoOutput) else next(iter(sections)), exc)
            values[fact.name] = fact.default
    return NodeFacts(node=node, reachable=True, elapsed=received - sent, errors=tuple(asked.notes), **values)


def collect(transport: Transport, req: FactsRequest, *, timeout: float = 20.0) -> NodeFacts:
    """Run every probe on the transport's node in one round trip; an unreachable node gives
    NodeFacts(reachable=False) with the transport's message."""
    sent = time.time()
    try:
        result, outs = run_bundle(transport, probe_commands(req), timeout=timeout)
    except SparkfleetError as exc:
        detail = getattr(exc, "detail", None) or exc.message
        if isinstance(exc, TransportTimeout):  # its message quotes the whole probe script: say it short
            detail = f"no answer within {timeout:g} s from {exc.where} (node hung or overloaded)"
        return NodeFacts(node=transport.node, reachable=False, error=detail, elapsed=time.time() - sent)
    received = time.time()
    if not outs:
        why = result.tail() or f"exit {result.exit_code}"
        return NodeFacts(node=transport.node, reachable=False, error=f"probe script failed: {why}")
    return parse_facts(transport.node, outs, req, sent, received)
