"""The Plan: frozen, per-rank, everything ``up`` needs. Made by ``plan.build.plan()``, executed
by ``sparkfleet.apply``, rendered by ``plan.render``; nothing after ``plan()`` reads the recipe."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from sparkfleet.plan.engines import Readiness
from sparkfleet.spec.cluster import Node
from sparkfleet.spec.recipe import Recipe, StagingSpec
from sparkfleet.spec.secrets import is_secret

EnvSource = Literal["engine", "cluster", "recipe", "cli"]
CONTAINER_HF_HOME = "/root/.cache/huggingface"
LABEL_DEPLOYMENT = "sparkfleet.deployment"
LABEL_RANK = "sparkfleet.rank"


@dataclass(frozen=True)
class Overrides:
    """What the command line adds on top of the recipe (``--set`` is applied when loading)."""

    env: tuple[tuple[str, str], ...] = ()
    name: str | None = None


@dataclass(frozen=True)
class MountSpec:
    """A bind mount of one rank's container."""

    host: str
    container: str
    read_only: bool


@dataclass(frozen=True)
class EnvVar:
    """One environment value and the layer it came from."""

    key: str
    value: str
    source: EnvSource

    @property
    def secret(self) -> bool:
        return is_secret(self.key)


@dataclass(frozen=True)
class StagingStep:
    """One staging action on one node, templates resolved."""

    id: str
    kind: str
    rank: int
    node: str
    src: str | None
    dst: str
    tp: int
    min_free: int
    spec: StagingSpec | None = None
    local_files: tuple[str, ...] = ()
    repo: str | None = None
    revision: str | None = None
    hf_cache: str | None = None
    primary: bool = True  # composed: the source the model path points at


@dataclass(frozen=True)
class RankPlan:
    """Everything needed to start, watch and stop one rank."""

    rank: int
    node: Node
    runtime: Literal["docker", "process"]
    image: str | None
    argv: tuple[str, ...]
    env: tuple[EnvVar, ...]
    mounts: tuple[MountSpec, ...]
    container_name: str
    container_argv: tuple[str, ...] | None
    workdir: str
    env_file: str
    log_path: str
    pid_path: str
    readiness: Readiness
    ports: tuple[int, ...]

    def env_dict(self) -> dict[str, str]:
        """The real environment (secrets included): only for the runtime that starts the rank."""
        return {v.key: v.value for v in self.env}


@dataclass(frozen=True)
class Plan:
    """A whole deployment, per rank, in launch order."""

    name: str
    title: str | None
    engine: str
    recipe_source: str
    cluster_name: str
    endpoint: str
    port: int
    served_model: str
    launch_order: tuple[int, ...]
    ranks: tuple[RankPlan, ...]
    staging: tuple[StagingStep, ...]
    recipe: Recipe = field(repr=False)

    @property
    def head(self) -> RankPlan:
        return self.ranks[0]

    def rank(self, r: int) -> RankPlan:
        return self.ranks[r]


_DOCKER_NAME = re.compile(r"[^a-zA-Z0-9_.-]+")


def container_name(deployment: str, rank: int) -> str:
    """The deterministic container name of a rank (Docker's allowed characters only)."""
    return f"sparkfleet-{_DOCKER_NAME.sub('-', deployment).strip('-.') or 'deployment'}-r{rank}"
