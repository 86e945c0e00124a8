"""Per-rank commands for schedulers that only know addresses at run time (Kubernetes, Slurm).

sparkfleet's planner needs concrete node addresses; an exporter plans against stand-in nodes
whose addresses are marker strings, then swaps each marker for the scheduler's own expression
(``$(LWS_LEADER_ADDRESS)`` in a pod spec, ``"$HEAD_ADDR"`` in an sbatch script). The commands
therefore come from the same engine adapters as ``sparkfleet up``: one source of truth.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from sparkfleet.config.cluster import Cluster, Node
from sparkfleet.config.recipe import Recipe
from sparkfleet.config.templates import render
from sparkfleet.plan.build import plan
from sparkfleet.plan.flags import flag_value
from sparkfleet.plan.model import Plan, RankPlan

_RANK_TEMPLATE = re.compile(r"\{\{\s*rank\s*\}\}")


@dataclass(frozen=True)
class Markers:
    """The marker strings an exporter will replace."""

    head: str
    self_addr: str
    rank: str
    peer: Callable[[int], str]
    # The address rank 0 plans itself at (default: head). Kubernetes gives the leader its own
    # host IP: the name workers reach it by is not an address Ray or vLLM can bind or advertise.
    leader_self: str | None = None


@dataclass(frozen=True)
class RankTemplates:
    """Rank 0's plan and one plan that stands for every rank above 0 (rank marker in place)."""

    plan: Plan
    leader: RankPlan
    worker: RankPlan | None


@dataclass(frozen=True)
class NodeShape:
    """What every stand-in node looks like: paths, and optionally a real node's NIC settings."""

    hf_cache: str
    home: str
    state_dir: str
    like: Node | None = None


def _node(index: int, fabric_ip: str, shape: NodeShape) -> Node:
    node = Node(
        name=f"rank{index}", host=f"rank{index}", fabric_ip=fabric_ip, transport="ssh", user=None,
        ssh_port=None, ssh_key=None, ssh_config=None, hf_cache=shape.hf_cache, state_dir=shape.state_dir,
        home=shape.home, gpus="all", memlock="unlimited", rdma=True, fabric_ifname=None, ib_hca=None,
        ib_gid_index=None, python="python3", env={},
    )  # fmt: skip
    if shape.like is None:
        return node
    # The scheduler places ranks, so every node is assumed to have the template node's NICs.
    keep = ("fabric_ifname", "ib_hca", "ib_gid_index", "env")
    return node.model_copy(update={k: getattr(shape.like, k) for k in keep})


def _plan(recipe: Recipe, name: str, addrs: list[str], shape: NodeShape) -> Plan:
    nodes = tuple(_node(i, a, shape) for i, a in enumerate(addrs))
    return plan(recipe, Cluster(name="export", nodes=nodes, source="(export)"), name)


def _with_rank(rank: RankPlan, marker: str) -> RankPlan:
    """Rank 1's plan with its --node-rank value replaced by the rank marker."""

    def swap(words: tuple[str, ...]) -> tuple[str, ...]:
        out = list(words)
        for i, word in enumerate(out[:-1]):
            if word == "--node-rank":
                out[i + 1] = marker
        return tuple(out)

    container = swap(rank.container_argv) if rank.container_argv is not None else None
    return replace(rank, argv=swap(rank.argv), container_argv=container)


def _rank_marked(recipe: Recipe, marker: str) -> Recipe:
    """The recipe with ``{{rank}}`` replaced by the rank marker, so one worker template serves
    every rank (the planner would render it as the stand-in rank's number)."""

    def mark(text: str) -> str:
        return _RANK_TEMPLATE.sub(marker, text)

    return recipe.model_copy(
        update={
            "args": tuple(mark(a) for a in recipe.args),
            "env": {k: mark(v) for k, v in recipe.env.items()},
            "extra_mounts": tuple(
                m.model_copy(update={"host": mark(m.host), "container": mark(m.container)}) for m in recipe.extra_mounts
            ),
        }
    )


def rank_templates(recipe: Recipe, name: str, markers: Markers, shape: NodeShape) -> RankTemplates:
    """Plan rank 0 with peers at their markers, and rank 1 at its own-address marker."""
    n = recipe.required_nodes
    recipe = _rank_marked(recipe, markers.rank)
    leader_addr = markers.leader_self or markers.head
    leader_plan = _plan(recipe, name, [leader_addr] + [markers.peer(i) for i in range(1, n)], shape)
    leader = leader_plan.ranks[0]
    if recipe.engine == "llama-cpp" and n > 1:
        leader = wait_for_rpc_servers(leader)
    worker = None
    if n > 1:
        worker_plan = _plan(recipe, name, [markers.head] + [markers.self_addr] * (n - 1), shape)
        worker = _with_rank(worker_plan.ranks[1], markers.rank)
    return RankTemplates(plan=leader_plan, leader=leader, worker=worker)


# Runs as `bash -c SCRIPT wait-rpc HOST:PORT,... ARGV...`: the command's words stay words.
_WAIT_RPC = (
    'IFS=, read -r -a peers <<< "$1"; shift; '
    'for peer in "${peers[@]}"; do '
    'until (: < "/dev/tcp/${peer%:*}/${peer##*:}") 2>/dev/null; do '
    'echo "sparkfleet: waiting for rpc-server $peer" >&2; sleep 2; done; done; '
    'exec "$@"'
)


def wait_for_rpc_servers(rank: RankPlan) -> RankPlan:
    """The llama.cpp leader started only once every rpc-server it names accepts connections.

    ``sparkfleet up`` starts the rpc-servers first and waits for their ports; a scheduler starts
    every pod or task at once, and llama-server gives up on an rpc-server that is not there yet.
    """
    argv = list(rank.argv)
    peers = next((argv[i + 1] for i, w in enumerate(argv[:-1]) if w in ("--rpc", "--rpc_servers")), None)
    if peers is None:
        return rank
    wrapped = ("bash", "-c", _WAIT_RPC, "wait-rpc", peers, *argv)
    container = rank.container_argv
    if container is not None:
        # docker run … --entrypoint PROGRAM IMAGE ARGS: the command's program is the entrypoint.
        at = len(container) - len(argv)
        assert container[at - 1] == argv[0] and tuple(container[at + 1 :]) == rank.argv[1:], container
        container = (*container[: at - 1], wrapped[0], container[at], *wrapped[1:])
    return replace(rank, argv=wrapped, container_argv=container)


def gpus_per_node(like: Node | None, recipe: Recipe) -> int:
    """GPUs each rank asks the scheduler for. A cluster node's ``gpus`` decides when given: a
    device list such as ``0,1`` counts, ``none`` asks for none (a CPU node: a GPU request there is
    refused). Otherwise the recipe: a vLLM/SGLang rank holds TP x PP / nodes GPUs (one on a DGX
    Spark, sparkrun's rule: tensor_parallel N = N hosts); llama.cpp only when it offloads layers."""
    if like is not None and like.gpus == "none":
        return 0
    if like is not None and like.gpus not in ("all", ""):
        return len([g for g in like.gpus.replace("device=", "").split(",") if g.strip()])
    if recipe.engine == "llama-cpp":
        layers = flag_value(recipe.args, "--n-gpu-layers", "--n_gpu_layers", "-ngl")
        return 1 if layers not in (None, "", "0") else 0
    ranks = recipe.tensor_parallel_size * recipe.pipeline_parallel_size
    return max(1, ranks // max(1, recipe.required_nodes))


def staged_paths(recipe: Recipe, deployment: str, values: dict[str, str]) -> list[str]:
    """Where ``sparkfleet stage`` leaves each staging step's output and the composed model on a
    node, with the node-dependent parts given as ``values`` (template name -> text)."""
    paths = [render(step.dst, values) for step in recipe.staging]
    if recipe.composed_model is not None:
        base = recipe.composed_model.dir or f"{{{{state}}}}/composed/{deployment}"
        paths.append(render(base, values) + "/model")
    return paths
