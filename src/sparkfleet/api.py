"""The library surface: what a script or a notebook needs, without the CLI.

    import sparkfleet

    recipe = sparkfleet.load_recipe("examples/gemma-llamacpp")
    cluster = sparkfleet.load_cluster(None)            # this machine; or a cluster.toml
    plan = sparkfleet.make_plan(recipe, cluster)      # pure: what up will do, per rank
    ready = sparkfleet.up(plan, cluster)              # starts, verifies, smoke-tests; rolls back on failure
    runs = sparkfleet.bench_decode(ready.name, concurrency=(1, 4), new_tokens=64)
    sparkfleet.down(ready.name)

Every function raises ``sparkfleet.errors.SparkfleetError`` (or a subclass) for what a user can
fix, with the message the CLI would print.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from sparkfleet.apply.down import down as _down
from sparkfleet.apply.observe import RankStatus
from sparkfleet.apply.observe import status as _status
from sparkfleet.apply.up import UpResult
from sparkfleet.apply.up import up as _up
from sparkfleet.bench.decode import DecodeConfig, DecodeTierRun, run_decode
from sparkfleet.bench.endpoint import resolve_endpoint
from sparkfleet.config.cluster import Cluster
from sparkfleet.config.cluster import load_cluster as _load_cluster
from sparkfleet.config.recipe import Recipe, deployment_name
from sparkfleet.config.recipe import load_recipe as _load_recipe
from sparkfleet.plan.build import plan as _plan
from sparkfleet.plan.model import Overrides, Plan
from sparkfleet.state.deployments import Deployment, Deployments

__all__ = [
    "Cluster",
    "Deployment",
    "Plan",
    "RankStatus",
    "Recipe",
    "UpResult",
    "bench_decode",
    "down",
    "load_cluster",
    "load_recipe",
    "make_plan",
    "status",
    "up",
]


def load_recipe(path: str | Path, sets: Sequence[str] = ()) -> Recipe:
    """A recipe file (or a folder holding recipe.toml), validated; ``sets`` are ``--set KEY=VALUE``."""
    return _load_recipe(path, tuple(sets))


def load_cluster(path: str | Path | None = None) -> Cluster:
    """A cluster inventory, or this machine as the one-node ``local`` cluster when path is None."""
    return _load_cluster(path)


def make_plan(recipe: Recipe, cluster: Cluster, *, name: str | None = None,
              env: dict[str, str] | None = None) -> Plan:  # fmt: skip
    """What ``up`` will do on every node (pure). name: the deployment name (default: the recipe
    folder's); env: ``--env`` values, the top layer of every rank's environment."""
    default = deployment_name(Path(recipe.source))
    return _plan(recipe, cluster, default, Overrides(env=tuple((env or {}).items()), name=name))


def up(plan: Plan, cluster: Cluster, *, timeout: float | None = None) -> UpResult:
    """Start the plan's ranks and return once the deployment really serves (else everything is
    stopped again and the error says why)."""
    return _up(plan, timeout=timeout)  # the Plan carries its cluster


def down(name: str) -> list[str]:
    """Stop every rank of the deployment this state dir started; returns what was stopped."""
    return _down(Deployments().require(name))


def status(name: str) -> list[RankStatus]:
    """Every rank's live state, read from its node."""
    return _status(Deployments().require(name))


def bench_decode(target: str, *, concurrency: Sequence[int] = (1, 2, 4), new_tokens: int = 256,
                 repeats: int = 3, model: str | None = None) -> list[DecodeTierRun]:  # fmt: skip
    """Decode speed of a deployment (by name) or an endpoint URL, per prompt type and concurrency,
    with exactly new_tokens generated per request (the results ``bench decode`` stores)."""
    config = DecodeConfig(concurrency=tuple(concurrency), new_tokens=new_tokens, repeats=repeats)
    return asyncio.run(run_decode(resolve_endpoint(target, model), config))
