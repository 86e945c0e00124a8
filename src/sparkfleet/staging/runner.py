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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sparkfleet.errors import NodeError, SparkfleetError, StagingError
from sparkfleet.plan import StagingStep
from sparkfleet.staging.bundle import worker_source
from sparkfleet.staging.composed import ComposedModel, compose_model
from sparkfleet.staging.sparse_rows import RESULT_MARKER
from sparkfleet.transport.base import Result, Transport

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


def _worker_args(step: StagingStep, verify: bool, chunk_bytes: int | None, progress_file: str | None) -> str:
    spec = step.spec
    args: dict[str, Any] = {
        "src": step.src,
        "dst": step.dst,
        "tp": step.tp,
        "rank": step.rank,
        "layout": spec.layout if spec is not None else "packed",
        "tables": list(spec.tables) if spec is not None else ["*.engram.embed.weight"],
        "min_free": step.min_free,
        "mode": "verify" if verify else "stage",
        "progress_file": progress_file,
    }
    if chunk_bytes:
        args["chunk_bytes"] = chunk_bytes
    return json.dumps(args)


def _parse_result(step: StagingStep, result: Result) -> dict[str, Any]:
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            data: dict[str, Any] = json.loads(line[len(RESULT_MARKER) :])
            if not data.get("ok"):
                raise StagingError(step.node, f"staging {step.id!r} (rank {step.rank}): {data.get('error')}")
            return data
    tail = result.tail() or "no output"
    raise StagingError(
        step.node, f"staging {step.id!r} (rank {step.rank}): the worker exited {result.exit_code}: {tail}"
    )


def _poll_progress(
    transport: Transport, step: StagingStep, path: str, done: threading.Event, progress: ProgressFn
) -> None:
    while not done.wait(_POLL_SECONDS):
        seen = transport.run(["cat", path], check=False, timeout=30)
        if seen.ok:
            try:
                state = json.loads(seen.stdout)
                progress(step, int(state["done"]), int(state["total"]))
            except (ValueError, KeyError, TypeError):
                continue  # a poll between the worker's write and rename


def _sparse_rows(
    transport: Transport,
    step: StagingStep,
    verify: bool,
    progress: ProgressFn | None,
    chunk_bytes: int | None,
    python: str,
) -> StageReport:
    if not step.src:
        raise StagingError(step.node, f"staging {step.id!r}: sparse-rows needs a src")
    progress_file = f"/tmp/sparkfleet-stage-{uuid.uuid4().hex}.json" if progress else None
    argv = [python, "-", _worker_args(step, verify, chunk_bytes, progress_file)]
    finished = threading.Event()
    poller = None
    if progress is not None and progress_file is not None:
        poller = threading.Thread(
            target=_poll_progress, args=(transport, step, progress_file, finished, progress), daemon=True
        )
        poller.start()
    try:
        result = transport.run(argv, stdin=worker_source(), check=False)
    finally:
        finished.set()
        if poller is not None:
            poller.join()
        if progress_file is not None:
            transport.run(["rm", "-f", progress_file, progress_file + ".tmp"], check=False, timeout=30)
    data = _parse_result(step, result)
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
    return StageReport(
        node=step.node, step_id=step.id, rank=step.rank, kind=step.kind, seconds=result.duration,
        outputs=outputs, hash=data.get("hash"),
    )  # fmt: skip


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
        return _sparse_rows(transport, step, verify, progress, chunk_bytes, python)
    if step.kind == "composed":
        composed, seconds = compose_model(transport, step, verify=verify, python=python)
        return StageReport(step.node, step.id, step.rank, step.kind, seconds, composed=composed)
    raise StagingError(
        step.node, f"staging {step.id!r}: kind {step.kind!r} is not handled by sparkfleet stage"
    )


def stage_all(
    steps: Sequence[StagingStep],
    transports: dict[str, Transport],
    *,
    verify: bool = False,
    progress: ProgressFn | None = None,
    chunk_bytes: int | None = None,
    pythons: dict[str, str] | None = None,
) -> list[StageReport]:
    """Run every step, nodes in parallel and each node's steps in order; errors are raised once
    all nodes have finished, naming every node that failed."""
    by_node: dict[str, list[StagingStep]] = {}
    for step in steps:
        by_node.setdefault(step.node, []).append(step)
    missing = sorted(set(by_node) - set(transports))
    if missing:
        raise StagingError(missing[0], "no transport for this node")

    def one_node(node: str) -> list[StageReport]:
        return [
            stage_rank(
                transports[node],
                s,
                verify=verify,
                progress=progress,
                chunk_bytes=chunk_bytes,
                python=(pythons or {}).get(node, "python3"),
            )
            for s in by_node[node]
        ]

    reports: list[StageReport] = []
    failures: list[SparkfleetError] = []
    with ThreadPoolExecutor(max_workers=max(1, len(by_node))) as pool:
        futures = {node: pool.submit(one_node, node) for node in by_node}
        for _node, future in futures.items():
            try:
                reports += future.result()
            except SparkfleetError as exc:
                failures.append(exc)
    if failures:
        first = failures[0]
        node = first.node if isinstance(first, NodeError) else "fleet"
        detail = first.detail if isinstance(first, NodeError) else str(first)
        more = "".join(f"\n{f}" for f in failures[1:])
        raise StagingError(node, detail + more)
    return reports
