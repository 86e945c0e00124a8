"""The Plan: frozen, per-rank, everything ``up`` needs. Made by ``plan.build.plan()``, executed
by ``sparkfleet.apply``, rendered by ``plan.render``; nothing after ``plan()`` reads the recipe."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from sparkfleet.config.cluster import Node
from sparkfleet.config.secrets import is_secret
from sparkfleet.plan.engines import Readiness
from sparkfleet.plan.secret_args import mask_words
from sparkfleet.plan.staging.base import StagingStep

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
class EnvOverride:
    """A recipe (or --env) value that replaced, on one node, a cluster value the cluster sets
    differently per node: `plan` warns, `plan --strict` refuses."""

    node: str
    key: str
    value: str
    source: EnvSource
    cluster_value: str
    cluster_values: tuple[tuple[str, str], ...]  # (node, value) for every planned node that sets key

    @property
    def message(self) -> str:
        where = "recipe [env]" if self.source == "recipe" else "--env"
        shown = "***" if is_secret(self.key) else None
        per_node = ", ".join(f"{n} {shown or v}" for n, v in self.cluster_values)
        return (
            f"node {self.node}: {where} {self.key}={shown or self.value} overrides the cluster's "
            f"{self.key}={shown or self.cluster_value} for this node (the cluster sets it per node: {per_node})"
        )


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
    stop_wave: int = 0  # down and rollback stop wave 0 on every node, then wave 1, ...
    # Credentials that stay in argv (the engine reads them nowhere else): masked in renderings.
    secret_words: tuple[str, ...] = ()

    def env_dict(self) -> dict[str, str]:
        """The real environment (secrets included): only for the runtime that starts the rank."""
        return {v.key: v.value for v in self.env}

    @property
    def handle(self) -> RankHandle:
        """What finds, watches and stops this rank once started (what the state stores)."""
        return RankHandle(
            rank=self.rank, node=self.node, runtime=self.runtime, image=self.image,
            argv=mask_words(self.argv, self.secret_words),
            mounts=self.mounts, container_name=self.container_name, workdir=self.workdir, env_file=self.env_file,
            log_path=self.log_path, pid_path=self.pid_path, readiness=self.readiness, ports=self.ports,
            stop_wave=self.stop_wave,
        )  # fmt: skip


@dataclass(frozen=True)
class RankHandle:
    """A started rank as the runtimes see it after ``up``: where it runs and where its files are,
    never its environment (secret values stay in the node's env file). ``RankPlan.handle`` makes
    one; the state store keeps it; inspect, probe, logs, follow and stop take it."""

    rank: int
    node: Node
    runtime: Literal["docker", "process"]
    image: str | None
    argv: tuple[str, ...]
    mounts: tuple[MountSpec, ...]
    container_name: str
    workdir: str
    env_file: str
    log_path: str
    pid_path: str
    readiness: Readiness
    ports: tuple[int, ...]
    # The engine adapter's stop order (see EngineAdapter.stop_waves); a record from before it
    # has 0 everywhere: all ranks at once, as those versions stopped them.
    stop_wave: int = 0

    @property
    def exit_path(self) -> str:
        """The process runtime's exit-code file, beside the pid file."""
        return self.pid_path.removesuffix(".pid") + ".exit"


@dataclass(frozen=True)
class VerifySpec:
    """When ``up`` is done: boot-log lines that must (and must not) appear, the smoke
    completion and its expected answer, and how long readiness may take."""

    expect: tuple[str, ...]
    forbid: tuple[str, ...]
    smoke_prompt: str
    smoke_expect: str
    smoke_max_tokens: int
    timeout: float
    fabric_min_gbps: float | None = None  # up measures every pair first and refuses below it


@dataclass(frozen=True)
class ServeSpec:
    """What ``watch`` does while the deployment serves: the restart policy (the whole deployment
    is taken down and brought up again: a multi-node engine cannot lose one rank) and the
    MemAvailable floor in bytes (None: no floor)."""

    restart: Literal["no", "on-failure"] = "no"
    max_restarts: int = 3
    backoff: float = 10.0
    mem_floor: int | None = None
    gateway: str | None = None  # the recipe's route settings for the gateway, JSON (spec.recipe.Serve)


@dataclass(frozen=True)
class ImageSpec:
    """The deployment's container image and, when the recipe names ``docker_image_dir``, its
    build context: an absolute path, or None when no such folder was found (``looked_in``)."""

    ref: str
    build_dir: str | None = None
    context: str | None = None
    looked_in: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemorySpec:
    """What the memory model needs beyond a rank's argv and env: the engine, the parallel
    layout, and the recipe's ``[memory]`` figures (the prefill coefficient already defaulted
    from the engine and model)."""

    engine: str
    tp: int
    nnodes: int
    kv_bytes_per_token: float | None = None
    weights_per_rank: int | None = None
    weights_exclude: tuple[str, ...] = ()
    cuda_graph: int | None = None
    prefill_bytes_per_token2: float | None = None
    head_overhead: int | None = None
    device_memory: int | None = None


@dataclass(frozen=True)
class Plan:
    """A whole deployment, per rank, in launch order: everything ``up``, ``doctor``, ``image``
    and the renderings need; nothing after ``plan()`` reads the recipe."""

    name: str
    title: str | None
    engine: str
    recipe_source: str
    cluster_name: str
    cluster_source: str
    endpoint: str
    port: int
    served_model: str
    launch_order: tuple[int, ...]
    ranks: tuple[RankPlan, ...]
    staging: tuple[StagingStep, ...]  # recipe order (a Hub fetch first); plan/staging/ has the kinds
    verify: VerifySpec
    memory: MemorySpec
    image: ImageSpec | None = None  # None: the ranks run as host processes
    revision: str | None = None  # the model's pinned snapshot revision
    model_repo: str | None = None  # the Hugging Face repo the weights come from (None: a path)
    variant: str = "base"  # the recipe's overlay this plan was made from (config/variants.py)
    serve: ServeSpec = ServeSpec()
    warnings: tuple[EnvOverride, ...] = ()  # per-node cluster values replaced by one value for all
    secret_args: tuple[str, ...] = ()  # what was found in the recipe's args (plan/secret_args.py)
    not_carried: tuple[str, ...] = ()  # what an import could not carry over (recipe `not_carried`)

    @property
    def head(self) -> RankPlan:
        return self.ranks[0]

    def rank(self, r: int) -> RankPlan:
        return self.ranks[r]


_DOCKER_NAME = re.compile(r"[^a-zA-Z0-9_.-]+")


def container_name(deployment: str, rank: int) -> str:
    """The deterministic container name of a rank (Docker's allowed characters only)."""
    return f"sparkfleet-{_DOCKER_NAME.sub('-', deployment).strip('-.') or 'deployment'}-r{rank}"
