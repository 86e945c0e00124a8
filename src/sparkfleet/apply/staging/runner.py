"""Run staging steps on nodes through their Transports: one rank, or every node in parallel.

The packer runs on the node (``python3 -`` with the bundled worker on stdin), so bytes never cross
the network twice. While it runs, the controller polls a small progress file the worker keeps up
to date and hands ``(step, done, total)`` to a callback (the CLI draws one bar per node).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sparkfleet.apply.staging.composed import ComposedModel, compose_model
from sparkfleet.errors import StagingError
from sparkfleet.nodes import files as node_files
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.ship import STAGE_WORKER, run_shipped
from sparkfleet.nodes.shipped.sparse_rows import RESULT_MARKER
from sparkfleet.nodes.transport.base import Result, Transport
from sparkfleet.plan.model import StagingStep

ProgressFn = Callable[[StagingStep, int, int], None]
_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class OutputReport:
    """One staged file: what was found (``status``) and what was done (``action``)."""

    path: str
    layout: str
    size: int
    status: str  # ok | missing | unvouched | source-changed | modified | damaged
    action: str  # verified | packed | repaired
    bytes_written: int
    chunks_rewritten: int
    chunks_total: int


@dataclass(frozen=True)
class StageReport:
    """What one staging step did on one node."""

    node: str
    step_id: str
    rank: int
    kind: str
    seconds: float
    outputs: tuple[OutputReport, ...] = ()
    hash: str | None = None
    composed: ComposedModel | None = None

    @property
    def bytes_written(self) -> int:
        return sum(o.bytes_written for o in self.outputs)

    @property
    def up_to_date(self) -> bool:
        """True when every output was already right (nothing needed writing)."""
        return all(o.status == "ok" for o in self.outputs)


def _job(step: StagingStep, verify: bool, chunk_bytes: int | None) -> dict[str, Any]:
    if not step.src:
        raise StagingError(step.node, f"staging {step.id!r}: sparse-rows needs a src")
    spec = step.spec
    job: dict[str, Any] = {
        "src": step.src,
        "dst": step.dst,
        "tp": step.tp,
        "rank": step.rank,
        "layout": spec.layout if spec is not None else "packed",
        "tables": list(spec.tables) if spec is not None else ["*.engram.embed.weight"],
        "min_free": step.min_free,
        "mode": "verify" if verify else "stage",
    }
    if chunk_bytes:
        job["chunk_bytes"] = chunk_bytes
    return job


def _parse_result(steps: Sequence[StagingStep], result: Result) -> list[dict[str, Any]]:
    first = steps[0]
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            data: dict[str, Any] = json.loads(line[len(RESULT_MARKER) :])
            jobs = data.get("jobs") if data.get("ok") else [data] * len(steps)
            for step, job in zip(steps, jobs or [], strict=True):
                if not job.get("ok"):
                    raise StagingError(step.node, f"staging {step.id!r} (rank {step.rank}): {job.get('error')}")
            return list(jobs or [])
    tail = result.tail() or "no output"
    raise StagingError(first.node, f"staging {first.id!r}: the worker exited {result.exit_code}: {tail}")


def _poll_progress(
    transport: Transport, steps: Sequence[StagingStep], path: str, done: threading.Event, progress: ProgressFn
) -> None:
    while not done.wait(_POLL_SECONDS):
        seen = node_files.read_text(transport, path)
        if seen is not None:
            try:
                state = json.loads(seen)
                progress(steps[int(state["job"])], int(state["done"]), int(state["total"]))
            except (ValueError, KeyError, TypeError, IndexError):
                continue  # a poll between the worker's write and rename


def _sparse_rows(
    transport: Transport,
    steps: Sequence[StagingStep],
    verify: bool,
    progress: ProgressFn | None,
    chunk_bytes: int | None,
    python: str,
) -> list[StageReport]:
    """All of one node's sparse-rows steps in one worker process (one interpreter start)."""
    progress_file = f"/tmp/sparkfleet-stage-{uuid.uuid4().hex}.json" if progress else None
    args = {"jobs": [_job(s, verify, chunk_bytes) for s in steps], "progress_file": progress_file}
    finished = threading.Event()
    poller = None
    if progress is not None and progress_file is not None:
        poller = threading.Thread(
            target=_poll_progress, args=(transport, steps, progress_file, finished, progress), daemon=True
        )
        poller.start()
    try:
        result = run_shipped(transport, python, STAGE_WORKER, [json.dumps(args)])
    finally:
        finished.set()
        if poller is not None:
            poller.join()
        if progress_file is not None:
            node_files.remove(transport, progress_file, progress_file + ".tmp")
    reports = []
    for step, data in zip(steps, _parse_result(steps, result), strict=True):
        outputs = tuple(
            OutputReport(
                path=o["path"], layout=o["layout"], size=o["size"], status=o["status"], action=o["action"],
                bytes_written=o["bytes_written"], chunks_rewritten=o["chunks_rewritten"],
                chunks_total=o["chunks_total"],
            )
            for o in data["outputs"]
        )  # fmt: skip
        if progress is not None:
            total = sum(o.size for o in outputs)
            progress(step, total, total)
        reports.append(
            StageReport(
                node=step.node,
                step_id=step.id,
                rank=step.rank,
                kind=step.kind,
                seconds=float(data["seconds"]),
                outputs=outputs,
                hash=data.get("hash"),
            )
        )
    return reports


def stage_rank(
    transport: Transport,
    step: StagingStep,
    *,
    verify: bool = False,
    progress: ProgressFn | None = None,
    chunk_bytes: int | None = None,
    python: str = "python3",
) -> StageReport:
    """Run one staging step on its node with the node's ``python``; with ``verify`` only check
    it, writing nothing."""
    if step.kind == "sparse-rows":
        return _sparse_rows(transport, [step], verify, progress, chunk_bytes, python)[0]
    if step.kind == "composed":
        composed, seconds = compose_model(transport, step, verify=verify, python=python)
        return StageReport(step.node, step.id, step.rank, step.kind, seconds, composed=composed)
    raise StagingError(step.node, f"staging {step.id!r}: kind {step.kind!r} is not handled by sparkfleet stage")


def stage_all(
    steps: Sequence[StagingStep],
    transports: dict[str, Transport],
    *,
    verify: bool = False,
    progress: ProgressFn | None = None,
    chunk_bytes: int | None = None,
    pythons: dict[str, str] | None = None,
) -> list[StageReport]:
    """Run every step, nodes in parallel; on each node its sparse-rows steps first, in one worker
    process, then the others in order. Errors are raised once all nodes have finished, naming
    every node that failed."""
    by_node: dict[str, list[StagingStep]] = {}
    for step in steps:
        by_node.setdefault(step.node, []).append(step)
    missing = sorted(set(by_node) - set(transports))
    if missing:
        raise StagingError(missing[0], "no transport for this node")

    def one_node(node: str) -> list[StageReport]:
        python = (pythons or {}).get(node, "python3")
        mine = by_node[node]
        rows = [s for s in mine if s.kind == "sparse-rows"]
        done = _sparse_rows(transports[node], rows, verify, progress, chunk_bytes, python) if rows else []
        for step in mine:
            if step.kind != "sparse-rows":
                done.append(stage_rank(transports[node], step, verify=verify, progress=progress, python=python))
        return done

    done = fan_out(by_node, one_node, workers=max(1, len(by_node))).raise_all(StagingError)
    return [report for node_reports in done.values() for report in node_reports]
