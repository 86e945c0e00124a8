"""Pipeline fan-out: the source sends a snapshot once, each node writes it and forwards it to the next.

Push shares the source's link among N targets (about N times one copy); in a chain every link
carries the stream once in and once out, so N targets take about the time of one. Stock tools
only (tar, tee, ssh: nodes/chain.py); each node's tar reports the records it unpacked, which come
back on the source's output as per-node progress. Resumable per file: only files some target lacks
or holds differently travel, so a cut run resends only what it had not finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from sparkfleet.apply.staging.snapshot_identity import Snapshot
from sparkfleet.apply.staging.transfer import Endpoint, SyncReport, _prepare, _source_stat, _stat, transfer_list
from sparkfleet.errors import StagingError
from sparkfleet.nodes import chain as node_chain
from sparkfleet.nodes.fanout import fan_out

NodeBytesFn = Callable[[str, int], None]


def pipeline(source: Endpoint, targets: Sequence[Endpoint], snapshot: Snapshot, *, include: Sequence[str],
             exclude: Sequence[str], on_bytes: NodeBytesFn | None = None) -> list[SyncReport]:  # fmt: skip
    """Bring every target's copy up to date with source's through one chain; one report per target."""
    start = time.monotonic()
    files, total = transfer_list(snapshot, include, exclude)
    by_node = {t.node: t for t in targets}
    fan_out(list(by_node), lambda n: _prepare(by_node[n])).raise_all(StagingError)
    want = _source_stat(source, files)
    have = fan_out(list(by_node), lambda n: _stat(by_node[n], files)).raise_all(StagingError)
    needs = {n: [p for p in files if have[n].get(p) != want[p]] for n in by_node}
    chain = [t for t in targets if needs[t.node]]
    todo = [p for p in files if any(p in needs[t.node] for t in chain)]
    payload = sum(want[p][0] for p in todo if want[p][2] is None)
    if chain:
        _run_chain(source, chain, todo, payload, on_bytes)
    took = time.monotonic() - start
    # Every node of the chain receives the whole stream (a file one node already had is rewritten).
    return [SyncReport(t.node, "pipeline", len(files), len(todo) if t in chain else 0, total,
                       payload if t in chain else 0, took) for t in targets]  # fmt: skip


def _ssh(forwarder: Endpoint, target: Endpoint) -> str:
    ssh = node_chain.ssh_to(forwarder.transport, target.transport, target.address)
    if ssh is None:
        raise StagingError(target.node, "a pipeline needs an SSH transport to this node")
    return ssh


def _run_chain(source: Endpoint, chain: list[Endpoint], todo: list[str], payload: int,
               on_bytes: NodeBytesFn | None) -> None:  # fmt: skip
    ssh = [_ssh(source, chain[0])] + [_ssh(chain[i - 1], chain[i]) for i in range(1, len(chain))]
    hops = [node_chain.Hop(t.transport, t.path, t.address) for t in chain]
    said: list[str] = []
    scripts = node_chain.script_paths(len(hops))
    try:
        with node_chain.start(source.transport, source.path, hops, ssh, todo, scripts) as stream:
            for line in stream:
                m = node_chain.PROGRESS.search(line)
                if m is None:
                    said.append(line.rstrip())
                elif on_bytes is not None:
                    on_bytes(chain[int(m.group(1))].node, min(int(m.group(2)) * node_chain.RECORD, payload))
            code = stream.wait()
    finally:
        node_chain.remove_scripts(hops, scripts)
    if code != 0:
        tail = "\n".join(said[-6:]) or "no output"
        route = " → ".join(t.node for t in chain)
        raise StagingError(chain[0].node, f"pipeline {source.node} → {route} exited {code}: {tail}\nRun again to "
                           "resend only the files that did not arrive, or use --method push")  # fmt: skip
    if on_bytes is not None:
        for t in chain:
            on_bytes(t.node, payload)
