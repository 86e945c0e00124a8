"""``sparse-rows``, controller side: all of one node's steps in one packer process there.

The packer runs on the node (nodes/shipped/sparse_rows.py, shipped as STAGE_WORKER), so bytes never
cross the network twice. While it runs, the controller polls a small progress file the worker keeps
up to date and hands ``(step, done, total)`` to the progress callback (the CLI draws one bar per node).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from sparkfleet.apply.staging.base import Context, OutputReport, ProgressFn, Runner, StageReport
from sparkfleet.errors import StagingError
from sparkfleet.nodes import files as node_files
from sparkfleet.nodes.ship import STAGE_WORKER, run_shipped
from sparkfleet.nodes.shipped.sparse_rows import RESULT_MARKER
from sparkfleet.nodes.transport.base import Result, Transport
from sparkfleet.plan.staging import StagingStep
from sparkfleet.plan.staging.sparse_rows import SparseRows

_POLL_SECONDS = 0.5
_OUTPUT_FIELDS = [f.name for f in fields(OutputReport)]


def _job(step: StagingStep, verify: bool, chunk_bytes: int | None) -> dict[str, Any]:
    entry = step.entry
    assert isinstance(entry, SparseRows) and entry.src
    return {"src": entry.src, "dst": entry.dst, "tp": step.tp, "rank": step.rank, "layout": entry.layout,
            "tables": list(entry.tables), "min_free": entry.min_free, "mode": "verify" if verify else "stage",
            **({"chunk_bytes": chunk_bytes} if chunk_bytes else {})}  # fmt: skip


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


def _poll_progress(transport: Transport, steps: Sequence[StagingStep], path: str, done: threading.Event,
                   progress: ProgressFn) -> None:  # fmt: skip
    while not done.wait(_POLL_SECONDS):
        seen = node_files.read_text(transport, path)
        if seen is not None:
            try:
                state = json.loads(seen)
                progress(steps[int(state["job"])], int(state["done"]), int(state["total"]))
            except (ValueError, KeyError, TypeError, IndexError):
                continue  # a poll between the worker's write and rename


def run(ctx: Context, steps: Sequence[StagingStep]) -> list[StageReport]:
    """All of one node's sparse-rows steps in one worker process (one interpreter start)."""
    transport, python, progress = ctx.transport(steps[0].node), ctx.python(steps[0].node), ctx.progress
    progress_file = f"/tmp/sparkfleet-stage-{uuid.uuid4().hex}.json" if progress else None
    args = {"jobs": [_job(s, ctx.verify, ctx.chunk_bytes) for s in steps], "progress_file": progress_file}
    finished = threading.Event()
    poller = None
    if progress is not None and progress_file is not None:
        poller = threading.Thread(target=_poll_progress, args=(transport, steps, progress_file, finished, progress),
                                  daemon=True)  # fmt: skip
        poller.start()
    try:
        result = run_shipped(transport, python, STAGE_WORKER, [json.dumps(args)])
    finally:
        finished.set()
        if poller is not None and progress_file is not None:
            poller.join()
            node_files.remove(transport, progress_file, progress_file + ".tmp")
    reports = []
    for step, data in zip(steps, _parse_result(steps, result), strict=True):
        outputs = tuple(OutputReport(**{k: o[k] for k in _OUTPUT_FIELDS}) for o in data["outputs"])
        if progress is not None:
            total = sum(o.size for o in outputs)
            progress(step, total, total)
        reports.append(StageReport(step.node, step.id, step.rank, step.kind, float(data["seconds"]), outputs,
                                   data.get("hash")))  # fmt: skip
    return reports


RUNNER = Runner(SparseRows, "node", run)
