"""``[composed_model]``, controller side: each node's composed directory (snapshot symlinks and
hard-linked local files) built, or only checked, by nodes/shipped/composed_worker.py there."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sparkfleet.apply.staging.base import Context, Runner, StageReport
from sparkfleet.errors import StagingError
from sparkfleet.nodes.ship import COMPOSE_WORKER, run_shipped
from sparkfleet.nodes.shipped import composed_worker
from sparkfleet.plan.staging import StagingStep
from sparkfleet.plan.staging.composed import Composed


@dataclass(frozen=True)
class ComposedModel:
    """A composed directory on one node."""

    node: str
    path: str  # the cache root (Hugging Face hub layout)
    model_dir: str  # the snapshot directory in it that holds the model's files
    revision: str
    extra_mounts: tuple[str, ...]  # what the symlinks point into: a container must see them at the same path
    links: int
    hard_links: int
    problems: tuple[str, ...] = ()


def _compose(ctx: Context, step: StagingStep) -> StageReport:
    """Build (or only check, with ``verify``) the step's composed directory on its node."""
    entry = step.entry
    assert isinstance(entry, Composed)
    args = {"repo_dir": entry.src, "dst": entry.dst, "revision": entry.revision, "primary": entry.primary,
            "local_files": list(entry.local_files), "verify": ctx.verify}  # fmt: skip
    result = run_shipped(ctx.transport(step.node), ctx.python(step.node), COMPOSE_WORKER, [json.dumps(args)])
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(composed_worker.RESULT_MARKER):
            data = json.loads(line[len(composed_worker.RESULT_MARKER) :])
            break
    else:
        raise StagingError(step.node, f"composed_model: the worker exited {result.exit_code}: {result.tail()}")
    if not data["ok"]:
        raise StagingError(step.node, f"composed_model: {data['error']}")
    model = ComposedModel(step.node, step.dst, data["model_dir"], data["revision"], tuple(data["mount_roots"]),
                          data["links"], data["hard_links"], tuple(data["problems"]))  # fmt: skip
    return StageReport(step.node, step.id, step.rank, step.kind, result.duration, composed=model)


RUNNER = Runner(Composed, "node", lambda ctx, steps: [_compose(ctx, step) for step in steps])
