"""``sync``, controller side: one entry's snapshot onto every node, then every copy checked.

The snapshot is listed at its source, then copied by transfer.py's rsync or tar stream, or from a
source node to two or more others down one pipeline (pipeline.py). A destination on storage another
node already writes (a NAS) is found by a marker file and not copied twice. Every node's listing is
then compared with the source's: a node that differs is refused, naming the files.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from functools import partial

from sparkfleet.apply.staging.base import Context, Runner
from sparkfleet.apply.staging.pipeline import pipeline
from sparkfleet.apply.staging.snapshot_identity import Snapshot, check_copy, check_identity, scan_node, select
from sparkfleet.apply.staging.transfer import Endpoint, SyncReport, sync_node, transfer_list
from sparkfleet.nodes import files as node_files
from sparkfleet.nodes.transport import controller
from sparkfleet.plan.staging import StagingStep
from sparkfleet.plan.staging.sync import Sync


def _endpoint(ctx: Context, node: str, path: str) -> Endpoint:
    return Endpoint(ctx.transport(node), path, ctx.nodes()[node].fabric_ip)


def run(ctx: Context, steps: Sequence[StagingStep]) -> list[SyncReport]:
    entry = steps[0].entry
    assert isinstance(entry, Sync) and ctx.plan is not None
    if entry.source_node is not None:
        src = next(s.src for s in steps if s.node == entry.source_node)
        assert src is not None
        source = _endpoint(ctx, entry.source_node, src)
    else:
        assert entry.src is not None
        source = Endpoint(controller(), entry.src)
    python = ctx.python(entry.source_node) if entry.source_node else "python3"
    snapshot = scan_node(source.transport, source.path, ctx.plan.revision, python=python)
    kept = [f.path for f in select(snapshot.files, entry.include, entry.exclude)]
    _, wanted = transfer_list(snapshot, entry.include, entry.exclude)
    shared = _shared_storage(ctx, source, [_endpoint(ctx, s.node, s.dst) for s in steps])

    def on_bytes(step: StagingStep, done: int) -> None:
        if ctx.progress is not None:
            ctx.progress(step, done, max(wanted, 1))

    # A chain needs a source node that reaches the others over SSH, and two targets to gain anything.
    chained = [
        s for s in steps
        if s.node not in shared and not (s.node == source.node and s.dst.rstrip("/") == source.path.rstrip("/"))
    ]  # fmt: skip
    piped: dict[str, SyncReport] = {}
    if ctx.fanout == "pipeline" and entry.source_node is not None and ctx.method != "rsync" and len(chained) > 1:
        by_node = {s.node: s for s in chained}
        ends = [_endpoint(ctx, s.node, s.dst) for s in chained]
        reports = pipeline(source, ends, snapshot, include=entry.include, exclude=entry.exclude,
                           on_bytes=lambda node, done: on_bytes(by_node[node], done))  # fmt: skip
        piped = {r.node: r for r in reports}

    def one(step: StagingStep) -> tuple[SyncReport, Snapshot]:
        target = _endpoint(ctx, step.node, step.dst)
        if step.node in shared:
            note = f"{step.dst} is the same storage as on {shared[step.node]}: nothing to copy"
            report = SyncReport(step.node, "shared", len(kept), 0, wanted, 0, 0.0, note)
        elif step.node in piped:
            report = piped[step.node]
        else:
            report = sync_node(source, target, snapshot, include=entry.include, exclude=entry.exclude,
                               method=ctx.method, on_bytes=partial(on_bytes, step))  # fmt: skip
        # Read back what the node now holds, right after its own copy finished.
        return report, check_copy(target.transport, target.path, snapshot, kept)

    # Nodes on shared storage are read back only once the copies they share have finished.
    done = ctx.parallel({s.node: partial(one, s) for s in steps if s.node not in shared})
    done += ctx.parallel({s.node: partial(one, s) for s in steps if s.node in shared})
    check_identity([copy for _, copy in done], reference=snapshot, include=entry.include, exclude=entry.exclude)
    for report, _ in done:
        if report.note and report.method == "tar":
            ctx.note(report.node, report.note)
    return [report for report, _ in done]


def _shared_storage(ctx: Context, source: Endpoint, targets: Sequence[Endpoint]) -> dict[str, str]:
    """Targets whose destination is storage another party already writes (a NAS cache mounted at
    the same path on several nodes, or the source's own folder): {node: the node holding it}.
    Probed with a marker file, not assumed: the same path on two nodes is often two local disks."""
    by_path: dict[str, list[Endpoint]] = {}
    for t in targets:
        by_path.setdefault(t.path.rstrip("/"), []).append(t)
    shared: dict[str, str] = {}
    for path, group in by_path.items():
        writer = source if source.path.rstrip("/") == path else group[0]
        others = [t for t in group if t.node != writer.node]
        if not others:
            continue
        marker = f"{path}/.sparkfleet-shared-{uuid.uuid4().hex}"
        if not node_files.make_marker(writer.transport, path, marker):
            continue  # cannot write there (read-only source): copy to every node
        try:
            jobs = {t.node: partial(node_files.exists, t.transport, marker) for t in others}
            seen = dict(zip(jobs, ctx.parallel(jobs), strict=True))
        finally:
            node_files.remove(writer.transport, marker)
        shared.update({node: writer.node for node, there in seen.items() if there})
    return shared


RUNNER = Runner(Sync, "distribute", run)
