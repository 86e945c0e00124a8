"""Compose a per-node model directory (snapshot symlinks + hard-linked local files) over a Transport."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sparkfleet.errors import StagingError
from sparkfleet.nodes.ship import COMPOSE_WORKER, run_shipped
from sparkfleet.nodes.shipped import composed_worker
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import StagingStep


@dataclass(frozen=True)
class ComposedModel:
    """A composed directory on one node.

    ``path`` is the cache root (Hugging Face hub layout), ``model_dir`` the snapshot directory
    inside it that holds the model's files, and ``extra_mounts`` the directories the symlinks
    point into: a container must see them at the same path for the links to resolve.
    """

    node: str
    path: str
    model_dir: str
    revision: str
    extra_mounts: tuple[str, ...]
    links: int
    hard_links: int
    problems: tuple[str, ...] = ()


def compose_model(
    transport: Transport, step: StagingStep, *, verify: bool = False, python: str = "python3"
) -> tuple[ComposedModel, float]:
    """Build (or only check, with ``verify``) the step's composed directory on its node."""
    if not step.src:
        raise StagingError(step.node, "composed_model: no source snapshot directory")
    args = {
        "repo_dir": step.src, "dst": step.dst, "revision": step.revision,
        "local_files": list(step.local_files), "verify": verify, "primary": step.primary,
    }  # fmt: skip
    result = run_shipped(transport, python, COMPOSE_WORKER, [json.dumps(args)])
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(composed_worker.RESULT_MARKER):
            data = json.loads(line[len(composed_worker.RESULT_MARKER) :])
            break
    else:
        raise StagingError(step.node, f"composed_model: the worker exited {result.exit_code}: {result.tail()}")
    if not data["ok"]:
        raise StagingError(step.node, f"composed_model: {data['error']}")
    model = ComposedModel(
        node=step.node, path=step.dst, model_dir=data["model_dir"], revision=data["revision"],
        extra_mounts=tuple(data["mount_roots"]), links=data["links"], hard_links=data["hard_links"],
        problems=tuple(data["problems"]),
    )  # fmt: skip
    return model, result.duration
