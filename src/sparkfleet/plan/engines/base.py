"""What an engine adapter provides, and the per-rank facts it is given."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sparkfleet.spec.recipe import Recipe


@dataclass(frozen=True)
class RankContext:
    """Everything about one rank that its command line depends on."""

    rank: int
    nnodes: int
    fabric_ip: str
    head_fabric_ip: str
    peer_fabric_ips: tuple[str, ...]
    port: int
    rendezvous_port: int
    model_ref: str
    model_file: str | None


@dataclass(frozen=True)
class Readiness:
    """How to tell that a rank is up."""

    serves_http: bool
    health_path: str | None
    ready_log: str | None
    tcp_port: int | None = None


class EngineAdapter(Protocol):
    """One engine's launch rules."""

    name: str
    default_port: int
    default_rendezvous_port: int
    default_entrypoint: tuple[str, ...]
    host_ip_env: tuple[str, ...]

    def check_recipe(self, recipe: Recipe) -> str | None:
        """A problem with the recipe for this engine (e.g. a per-rank flag in args), or None."""
        ...

    def check_layout(self, recipe: Recipe) -> str | None:
        """A problem with how the recipe spreads over ``required_nodes`` (a node that would get
        nothing to do), or None. Needs no cluster: ``validate`` asks it too."""
        ...

    def rank_argv(self, recipe: Recipe, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        """The full command of one rank: entrypoint, model, recipe args, per-rank flags."""
        ...

    def readiness(self, ctx: RankContext) -> Readiness:
        """How this rank shows it is ready."""
        ...


def flag_names(args: Sequence[str]) -> set[str]:
    """The option names in an argument list (``--a=b`` counts as ``--a``)."""
    return {a.split("=", 1)[0] for a in args if a.startswith("-") and len(a) > 1 and not is_number(a)}


def is_number(word: str) -> bool:
    """True for words like ``-1`` or ``0.5`` that look like flags but are values."""
    try:
        float(word)
    except ValueError:
        return False
    return True


def conflicting_flag(args: Sequence[str], reserved: Iterable[str], engine: str) -> str | None:
    """A message if args already set a flag the launcher appends per rank, else None."""
    present = flag_names(args)
    normalise = {r.replace("_", "-"): r for r in reserved}
    for flag in sorted(present):
        if flag.replace("_", "-") in normalise:
            return (
                f"args: {flag} is set by sparkfleet for each rank ({engine}); "
                "remove it from args (the recipe's tensor_parallel_size/port fields set these)"
            )
    return None


def gpu_ranks_cover_nodes(recipe: Recipe) -> str | None:
    """For engines whose every node holds tensor/pipeline-parallel ranks: TP × PP must reach
    required_nodes, or some node would hold none."""
    ranks = recipe.tensor_parallel_size * recipe.pipeline_parallel_size
    if ranks < recipe.required_nodes:
        return (
            f"tensor_parallel_size × pipeline_parallel_size = {ranks} is smaller than "
            f"required_nodes = {recipe.required_nodes}: some nodes would hold no rank"
        )
    return None
