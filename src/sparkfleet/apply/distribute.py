"""Distribution: run a plan's ``sync``, ``copy`` and ``nfs`` staging steps on every node.

``distribute(plan, transports, progress=...)`` is what ``up`` and ``stage`` call before launch.
Steps run in recipe order; within a step every node works in parallel. Any failure aborts
(after the other nodes of that step have finished, so nothing is left half-running) with one
StagingError naming every failed node. After a ``sync``, every node's copy is compared with the
source (file list, sizes, hashes of index and config files): a node that differs is refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from sparkfleet.apply.staging.copy import CopyReport, copy_files, local_files
from sparkfleet.apply.staging.nfs import NfsReport, check_volume, ensure_volume, export
from sparkfleet.apply.staging.pipeline import pipeline
from sparkfleet.apply.staging.snapshot_identity import Snapshot, check_copy, check_identity, scan_node, select
from sparkfleet.apply.staging.sync import Endpoint, Method, SyncReport, sync_node, transfer_list
from sparkfleet.config.cluster import Node
from sparkfleet.errors import StagingError
from sparkfleet.nodes import files as node_files
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.transport import controller
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import Plan, StagingStep, volume_name

ProgressFn = Callable[[StagingStep, int, int], None]
# pipeline: source → node → node …, each forwarding while it writes (apply/staging/pipeline.py);
# push: the source copies to every target at once (its link shared among them).
Fanout = Literal["pipeline", "push"]
KINDS = ("sync", "copy", "nfs")
T = TypeVar("T")


@dataclass(frozen=True)
class DistributionReport:
    """Everything distribution did, per node."""

    synced: tuple[SyncReport, ...] = ()
    copied: tuple[CopyReport, ...] = ()
    nfs: tuple[NfsReport, ...] = ()
    snapshots: tuple[Snapshot, ...] = ()

    @property
    def bytes_sent(self) -> int:
        return sum(r.bytes_sent for r in self.synced) + sum(r.bytes_sent for r in self.copied)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the user should be told (e.g. rsync missing on a node: a tar stream was used)."""
        return tuple(f"{r.node}: {r.note}" for r in self.synced if r.note and r.method == "tar")


def _parallel(jobs: Mapping[str, Callable[[], T]]) -> list[T]:
    """Run one job per node at once; raise one StagingError naming every node that failed."""
    return list(fan_out(jobs, lambda node: jobs[node](), workers=max(1, len(jobs))).raise_all(StagingError).values())


def _nodes(plan: Plan) -> dict[str, Node]:
    return {r.node.name: r.node for r in plan.ranks}


def _transport(transports: Mapping[str, Transport], node: str) -> Transport:
    if node not in transports:
        raise StagingError(node, "no transport for this node")
    return transports[node]


def _endpoint(transports: Mapping[str, Transport], nodes: Mapping[str, Node], name: str, path: str) -> Endpoint:
    node = nodes[name]
    return Endpoint(_transport(transports, name), path, node.fabric_ip, node.user, node.ssh_port)


def _sync(
    plan: Plan,
    steps: Sequence[StagingStep],
    transports: Mapping[str, Transport],
    progress: ProgressFn | None,
    method: Method,
    fanout: Fanout = "pipeline",
) -> tuple[list[SyncReport], list[Snapshot]]:
    spec = steps[0].spec
    assert spec is not None
    nodes = _nodes(plan)
    step_id = steps[0].id
    revision = steps[0].revision or plan.revision
    if spec.source_node is not None:
        if spec.source_node not in nodes:
            raise StagingError(
                spec.source_node,
                f"staging {step_id!r}: source_node {spec.source_node!r} is not one of this deployment's "
                f"nodes ({', '.join(nodes)})",
            )
        src_step = next(s for s in steps if s.node == spec.source_node)
        if not src_step.src:
            raise StagingError(spec.source_node, f"staging {step_id!r}: sync needs a src")
        source = _endpoint(transports, nodes, spec.source_node, src_step.src)
    else:
        if not steps[0].src:
            raise StagingError("controller", f"staging {step_id!r}: sync needs a src")
        source = Endpoint(controller(), steps[0].src)
    python = nodes[spec.source_node].python if spec.source_node else "python3"
    snapshot = scan_node(source.transport, source.path, revision, python=python)

    kept = [f.path for f in select(snapshot.files, spec.include, spec.exclude)]
    _, wanted = transfer_list(snapshot, spec.include, spec.exclude)
    shared = _shared_storage(source, [_endpoint(transports, nodes, s.node, s.dst) for s in steps])

    def one(step: StagingStep) -> Callable[[], tuple[SyncReport, Snapshot]]:
        def job() -> tuple[SyncReport, Snapshot]:
            target = _endpoint(transports, nodes, step.node, step.dst)
            if step.node in shared:
                note = f"{step.dst} is the same storage as on {shared[step.node]}: nothing to copy"
                report = SyncReport(step.node, "shared", len(kept), 0, wanted, 0, 0.0, note)
            else:

                def on_bytes(done: int) -> None:
                    if progress is not None:
                        progress(step, done, max(wanted, 1))

                report = sync_node(
                    source, target, snapshot, include=spec.include, exclude=spec.exclude, method=method,
                    on_bytes=on_bytes,
                )  # fmt: skip
            # Read back what the node now holds, right after its own copy finished.
            return report, check_copy(target.transport, target.path, snapshot, kept)

        return job

    # A chain needs a source node that reaches the others over SSH, and two targets to gain anything.
    chained = [
        s for s in steps
        if s.node not in shared and not (s.node == source.node and s.dst.rstrip("/") == source.path.rstrip("/"))
    ]  # fmt: skip
    piped: dict[str, SyncReport] = {}
    if fanout == "pipeline" and spec.source_node is not None and method != "rsync" and len(chained) > 1:
        by_node = {s.node: s for s in chained}

        def node_bytes(node: str, done: int) -> None:
            if progress is not None:
                progress(by_node[node], done, max(wanted, 1))

        ends = [_endpoint(transports, nodes, s.node, s.dst) for s in chained]
        reports = pipeline(source, ends, snapshot, include=spec.include, exclude=spec.exclude, on_bytes=node_bytes)
        piped = {r.node: r for r in reports}

    def checked(step: StagingStep) -> Callable[[], tuple[SyncReport, Snapshot]]:
        def job() -> tuple[SyncReport, Snapshot]:
            target = _endpoint(transports, nodes, step.node, step.dst)
            return piped[step.node], check_copy(target.transport, target.path, snapshot, kept)

        return job

    # Nodes on shared storage are read back only once the copies they share have finished.
    done = _parallel({s.node: (checked(s) if s.node in piped else one(s)) for s in steps if s.node not in shared})
    done += _parallel({s.node: one(s) for s in steps if s.node in shared})
    copies = [copy for _, copy in done]
    check_identity(copies, reference=snapshot, include=spec.include, exclude=spec.exclude)
    return [report for report, _ in done], copies


def _shared_storage(source: Endpoint, targets: Sequence[Endpoint]) -> dict[str, str]:
    """Targets whose destination is storage another party already writes (a NAS cache mounted at
    the same path on several nodes, or the source's own folder): {node: the node holding it}.

    Probed, not assumed: the same path on two nodes is often two local disks. A marker file is
    written where the copy will go (or at the source) and looked for on the others.
    """
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
            seen = dict(zip(jobs, _parallel(jobs), strict=True))
        finally:
            node_files.remove(writer.transport, marker)
        shared.update({node: writer.node for node, there in seen.items() if there})
    return shared


def _scan(
    transports: Mapping[str, Transport], nodes: Mapping[str, Node], step: StagingStep, revision: str | None
) -> Snapshot:
    return scan_node(_transport(transports, step.node), step.dst, revision, python=nodes[step.node].python)


def verify_snapshots(plan: Plan, transports: Mapping[str, Transport]) -> tuple[Snapshot, ...]:
    """Compare every node's copy of each ``sync`` step's snapshot with the first node's (at the
    recipe's pinned revision, else ``main``); raise a StagingError naming the nodes and files that
    differ. For ``up`` when nothing is synced but the caches must still agree."""
    nodes = _nodes(plan)
    out: list[Snapshot] = []
    for _step_id, steps in _grouped(plan.staging, ("sync",)):
        spec = steps[0].spec
        assert spec is not None
        revision = steps[0].revision or plan.revision
        found = _parallel({s.node: partial(_scan, transports, nodes, s, revision) for s in steps})
        check_identity(found, include=spec.include, exclude=spec.exclude)
        out.extend(found)
    return tuple(out)


def _copy(plan: Plan, steps: Sequence[StagingStep], transports: Mapping[str, Transport]) -> list[CopyReport]:
    spec = steps[0].spec
    assert spec is not None
    step_id = steps[0].id
    base = Path(plan.recipe_source).parent if plan.recipe_source else Path.cwd()
    names = list(spec.files)
    if not names and steps[0].src:
        folder = Path(steps[0].src)
        names = sorted(str(p) for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    if not names:
        raise StagingError("controller", f"staging {step_id!r}: copy names no files (files = [...] or src)")
    files = local_files(names, base, step_id)
    return _parallel(
        {s.node: partial(copy_files, _transport(transports, s.node), files, s.dst, step_id) for s in steps}
    )


def _nfs(plan: Plan, steps: Sequence[StagingStep], transports: Mapping[str, Transport]) -> list[NfsReport]:
    spec = steps[0].spec
    assert spec is not None
    step_id = steps[0].id
    nodes = _nodes(plan)
    server_name = spec.server_node or plan.head.node.name
    if server_name not in nodes:
        raise StagingError(server_name, f"staging {step_id!r}: server_node is not one of this deployment's nodes")
    server_step = next(s for s in steps if s.node == server_name)
    if not server_step.src:
        raise StagingError(server_name, f"staging {step_id!r}: nfs needs src (the folder to export)")
    path = server_step.src
    volume = volume_name(plan.name, step_id)
    clients = [s for s in steps if s.node != server_name]
    server_ip = nodes[server_name].fabric_ip
    reports = [export(_transport(transports, server_name), path, [nodes[s.node].fabric_ip for s in clients], volume)]
    image = plan.head.image
    check = spec.check_file or "config.json"

    def client(step: StagingStep) -> NfsReport:
        t = _transport(transports, step.node)
        report = ensure_volume(t, volume, server_ip, path, spec.options)
        if image:
            check_volume(t, volume, image, check)
        return report

    reports += _parallel({s.node: partial(client, s) for s in clients})
    return reports


def _grouped(steps: Sequence[StagingStep], kinds: Sequence[str]) -> Iterator[tuple[str, list[StagingStep]]]:
    order: dict[str, list[StagingStep]] = {}
    for step in steps:
        if step.kind in kinds:
            order.setdefault(step.id, []).append(step)
    yield from order.items()


def distribute(
    plan: Plan,
    transports: Mapping[str, Transport],
    progress: ProgressFn | None = None,
    *,
    kinds: Sequence[str] = KINDS,
    method: Method = "auto",
    fanout: Fanout = "pipeline",
) -> DistributionReport:
    """Run the plan's sync/copy/nfs steps (recipe order; nodes in parallel within a step).

    ``progress(step, done_bytes, total_bytes)`` is called from worker threads as bytes move.
    ``method`` forces rsync or the tar stream (``auto``: rsync where both ends have it).
    ``fanout``: a sync from a source node to two or more targets goes through one pipeline (each
    node forwards to the next while writing), or, with ``push``, from the source to all at once.
    Raises StagingError on the first step that fails on any node; later steps do not run.
    """
    synced: list[SyncReport] = []
    copied: list[CopyReport] = []
    nfs: list[NfsReport] = []
    snapshots: list[Snapshot] = []
    for _step_id, steps in _grouped(plan.staging, [k for k in kinds if k in KINDS]):
        kind = steps[0].kind
        if kind == "sync":
            reports, copies = _sync(plan, steps, transports, progress, method, fanout)
            synced += reports
            snapshots += copies
        elif kind == "copy":
            copied += _copy(plan, steps, transports)
        else:
            nfs += _nfs(plan, steps, transports)
    return DistributionReport(tuple(synced), tuple(copied), tuple(nfs), tuple(snapshots))


@contextmanager
def rich_progress(console: Console) -> Iterator[ProgressFn]:
    """One transfer bar per (step, node) on console while the block runs; yields the callback."""
    bars = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=console, transient=False,
    )  # fmt: skip
    tasks: dict[tuple[str, str], TaskID] = {}

    def update(step: StagingStep, done: int, total: int) -> None:
        key = (step.id, step.node)
        if key not in tasks:
            tasks[key] = bars.add_task(f"{step.id} → {step.node}", total=total)
        bars.update(tasks[key], completed=min(done, total), total=total)

    with bars:
        yield update
