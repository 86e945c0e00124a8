"""Running one rank of the collective sweep (nodes/shipped/collective_sweep.py) on its node, with
the interpreter and environment its engine gets: the rank's own Python for a process rank, its
image for a docker rank (the image's `python3`, the rank's GPUs, memlock and /dev/infiniband)."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkfleet.config.cluster import Node
from sparkfleet.nodes.runtime.docker import device_words
from sparkfleet.nodes.ship import COLLECTIVE_SWEEP, program_text
from sparkfleet.nodes.transport.base import Result, Transport


@dataclass(frozen=True)
class SweepRank:
    """One rank of the sweep: where it runs and with what."""

    rank: int
    node: Node
    runtime: str  # "process" | "docker"
    python: str  # the process rank's interpreter, or the image's python3
    image: str | None
    env: tuple[tuple[str, str], ...]  # the rank's planned environment, secrets left out


def rank_python(argv: Sequence[str], fallback: str) -> str:
    """The interpreter that runs a process rank's engine: the entrypoint when it is a Python, else
    the `python` beside an absolute entrypoint (a venv's bin/vllm), else the node's."""
    head = argv[0] if argv else ""
    if posixpath.basename(head).startswith("python"):
        return head
    if head.startswith("/"):
        return posixpath.join(posixpath.dirname(head), "python")
    return fallback


def sweep_argv(r: SweepRank, args: Mapping[str, object]) -> list[str]:
    """The words that start rank r's part of the sweep; the program comes on stdin."""
    words = [r.python, "-", json.dumps(dict(args))]
    if r.runtime != "docker":
        return words
    env = [w for key, _ in r.env for w in ("-e", key)]  # values from the docker client's environment
    return ["docker", "run", "--rm", "-i", "--network", "host", "--ipc", "host", *device_words(r.node), *env,
            "--entrypoint", r.python, r.image or "", *words[1:]]  # fmt: skip


def run_sweep_rank(transport: Transport, r: SweepRank, args: Mapping[str, object], timeout: float) -> Result:
    """Run rank r's part; its Result, unchecked (the program reports its failures as JSON)."""
    return transport.run(sweep_argv(r, args), stdin=program_text(COLLECTIVE_SWEEP).encode(), env=dict(r.env),
                         timeout=timeout, check=False)  # fmt: skip
