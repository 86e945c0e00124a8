"""What an engine adapter provides, and the narrow facts it is given.

Adapters see no Recipe: ``LaunchSpec`` carries the fields of a recipe their rules read (with
``args`` already rendered for one rank when planning), ``RankContext`` the per-rank facts.
Everything engine-specific lives behind this protocol: per-rank flags, readiness, layout
checks, the served model name, how a Hugging Face model is opened, the memory model's flags and
estimates, and how a running server aborts its requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from sparkfleet.plan.flags import first_present, flag_name, flag_value, has_flag, is_flag, normal


@dataclass(frozen=True)
class LaunchSpec:
    """The recipe fields an engine's launch rules read (``args`` rendered for the rank)."""

    args: tuple[str, ...]
    model: str
    served_model_name: str | None = None
    model_file: str | None = None
    revision: str | None = None
    composed: bool = False  # the model is a [composed_model] directory
    required_nodes: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_backend: Literal["mp", "ray"] = "mp"
    # "sparkfleet": the adapter writes the parallel sizes, host and port itself (args may not set
    # them). "sparkrun" (imported sparkrun recipes): args keep them as the recipe spelled them and
    # the adapter only replaces their values, adding none the recipe lacks (set_in_place); for
    # llama.cpp also the model flag (-hf repo:QUANT, -m path).
    command_style: Literal["sparkfleet", "sparkrun"] = "sparkfleet"


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
    # The rank's rendered entrypoint (the recipe's, else the adapter's default): an engine
    # with two servers (llama.cpp's llama-server and llama-cpp-python's) tells them apart by it.
    entrypoint: tuple[str, ...] = ()
    bind_ip: str = "0.0.0.0"  # where this rank's servers listen (the node's bind_address)


@dataclass(frozen=True)
class Readiness:
    """How to tell that a rank is up."""

    serves_http: bool
    health_path: str | None
    ready_log: str | None
    tcp_port: int | None = None


@dataclass(frozen=True)
class MemoryRules:
    """The flags the memory model reads for a GPU engine with a static memory pool."""

    fraction_flag: str  # the pool as a fraction of device memory
    fraction_default: float
    chunk_flag: str  # prefill chunk size
    chunk_default: int
    context_flag: str  # the longest request
    kv_tokens_flag: str | None = None  # pins the KV pool by tokens
    kv_bytes_flag: str | None = None  # pins the KV pool by bytes


@dataclass(frozen=True)
class AbortRoute:
    """An HTTP route that aborts every running request of a server."""

    path: str
    body: tuple[tuple[str, object], ...] = ()


class EngineAdapter(Protocol):
    """One engine's launch rules."""

    name: str
    default_port: int
    default_rendezvous_port: int
    default_entrypoint: tuple[str, ...]
    host_ip_env: tuple[str, ...]
    # The memory model's flags; None: no static GPU pool to plan (llama.cpp).
    memory: MemoryRules | None
    # How the memory guard stops a running prefill: a route to call, else closing the
    # client's connections, which the engine turns into an abort when it says so here.
    abort_route: AbortRoute | None
    aborts_on_disconnect: bool

    def check_recipe(self, spec: LaunchSpec) -> str | None:
        """A problem with the recipe for this engine (e.g. a per-rank flag in args), or None."""
        ...

    def check_layout(self, spec: LaunchSpec) -> str | None:
        """A problem with how the recipe spreads over ``required_nodes`` (a node that would get
        nothing to do), or None. Needs no cluster: ``validate`` asks it too."""
        ...

    def rank_argv(self, spec: LaunchSpec, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        """The full command of one rank: entrypoint, model, recipe args, per-rank flags."""
        ...

    def readiness(self, ctx: RankContext) -> Readiness:
        """How this rank shows it is ready."""
        ...

    def served_model(self, spec: LaunchSpec) -> str:
        """The model id the server answers to."""
        ...

    def hub_model_ref(self, model: str, revision: str | None, hf_root: str) -> str:
        """What the engine is given for a Hugging Face repo id, with the cache at hf_root."""
        ...

    def hub_profile(self, spec: LaunchSpec) -> tuple[str, str | None]:
        """Which files of a Hub repo the engine loads: ``("safetensors", None)`` (shards named by the
        index, configs, tokenizer, chat template) or ``("gguf", model_file)``."""
        ...

    def fetches_at_start(self, spec: LaunchSpec) -> bool:
        """True when the engine downloads the model itself as it starts (llama.cpp's ``-hf
        repo:QUANT`` in an imported sparkrun recipe): nothing is staged for it, the rank is not
        told to stay offline and its Hugging Face cache is mounted writable."""
        ...

    def cuda_graphs(self, argv: Sequence[str]) -> tuple[int, str]:
        """The CUDA graph memory estimate from a planned argv, and how it was made."""
        ...

    def prefill_bytes_per_token2(self, model: str, parent_model: str | None) -> float | None:
        """The prefill transient's coefficient known for this engine serving model, or None."""
        ...

    def stop_waves(self, nnodes: int) -> tuple[tuple[int, ...], ...]:
        """The order in which down and rollback stop the ranks: each wave is stopped (SIGTERM,
        SIGKILL after the grace period) on every node at once, before the next wave begins."""
        ...


class AdapterDefaults:
    """What most engines share; an adapter overrides what differs."""

    memory: MemoryRules | None = None
    abort_route: AbortRoute | None = None
    aborts_on_disconnect = False
    served_name_flags: tuple[str, ...] = ("--served-model-name",)

    def served_model(self, spec: LaunchSpec) -> str:
        return flag_value(spec.args, *self.served_name_flags) or spec.served_model_name or spec.model

    def hub_model_ref(self, model: str, revision: str | None, hf_root: str) -> str:
        # The engine resolves the repo id itself in the mounted Hugging Face cache.
        return model

    def hub_profile(self, spec: LaunchSpec) -> tuple[str, str | None]:
        return ("safetensors", None)

    def fetches_at_start(self, spec: LaunchSpec) -> bool:
        return False

    def cuda_graphs(self, argv: Sequence[str]) -> tuple[int, str]:
        return 0, "none for this engine"

    def prefill_bytes_per_token2(self, model: str, parent_model: str | None) -> float | None:
        return None

    def stop_waves(self, nnodes: int) -> tuple[tuple[int, ...], ...]:
        # Every rank handles SIGTERM itself: stop them all at once.
        return (tuple(range(nnodes)),)


def head_first(nnodes: int) -> tuple[tuple[int, ...], ...]:
    """Rank 0, then every other rank: for engines whose head tells the workers to shut down."""
    return ((0,), tuple(range(1, nnodes))) if nnodes > 1 else ((0,),)


def conflicting_flag(args: Sequence[str], reserved: Iterable[str], engine: str) -> str | None:
    """A message if args already set a flag the launcher appends per rank, else None."""
    flag = first_present(args, reserved)
    if flag is None:
        return None
    return (
        f"args: {flag} is set by sparkfleet for each rank ({engine}); "
        "remove it from args (the recipe's tensor_parallel_size/port fields set these)"
    )


def reserved_flags(spec: LaunchSpec, reserved: Sequence[str], sparkrun_own: Sequence[str]) -> tuple[str, ...]:
    """The flags args may not set: in sparkrun style the recipe keeps sparkrun_own (plan sets
    their values in place)."""
    if spec.command_style == "sparkfleet":
        return tuple(reserved)
    return tuple(f for f in reserved if f not in sparkrun_own)


def set_in_place(args: Sequence[str], names: Iterable[str], value: str) -> tuple[tuple[str, ...], bool]:
    """args with the value of every occurrence of any of names (aliases of one option, as
    written: ``-tp 2``, ``--tp-size=2``) replaced by value, spelling and position kept; and
    whether any occurred. A flag written without a value gets one after it."""
    wanted = {normal(n) for n in names}
    out: list[str] = []
    found = False
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if not (is_flag(word) and normal(flag_name(word)) in wanted):
            out.append(word)
            continue
        found = True
        name, eq, _ = word.partition("=")
        if eq:
            out.append(f"{name}={value}")
            continue
        out += [word, value]
        if i < len(args) and not is_flag(args[i]):
            i += 1  # the old value
    return tuple(out), found


def sparkrun_style_args(
    args: Sequence[str],
    sizes: Iterable[tuple[Iterable[str], int]],
    host: Iterable[str],
    port: Iterable[str],
    ctx: RankContext,
    default_port: int,
) -> tuple[str, ...]:
    """A sparkrun-style recipe's args for one rank: the parallel-size, host and port flags keep the
    recipe's spelling and place, their values this plan's (sizes, the rank's bind address and
    port). No flag is added for a size the recipe does not write (sparkrun passes none); a bind
    address or port the recipe does not write is added only where the site's differs from what
    the engine does without it (all addresses, its default port)."""
    out = tuple(args)
    for names, size in sizes:
        out, _ = set_in_place(out, names, str(size))
    out, has_host = set_in_place(out, host, ctx.bind_ip)
    out, has_port = set_in_place(out, port, str(ctx.port))
    if not has_host and ctx.bind_ip != "0.0.0.0":
        out += ("--host", ctx.bind_ip)
    if not has_port and ctx.port != default_port:
        out += ("--port", str(ctx.port))
    return out


def revision_flags(spec: LaunchSpec, model_ref: str) -> tuple[str, ...]:
    """``--revision REV`` when the engine resolves a Hugging Face repo id itself (SGLang, vLLM):
    offline, without it the engine loads whatever ``refs/main`` points at in the node's cache,
    not the snapshot the recipe pins. A path (composed model, local dir) or args that already
    name a revision get nothing."""
    if not spec.revision or spec.composed or model_ref.startswith("/") or has_flag(spec.args, "--revision"):
        return ()
    return ("--revision", spec.revision)


def gpu_ranks_cover_nodes(spec: LaunchSpec) -> str | None:
    """For engines whose every node holds tensor/pipeline-parallel ranks: TP × PP must reach
    required_nodes, or some node would hold none."""
    ranks = spec.tensor_parallel_size * spec.pipeline_parallel_size
    if ranks < spec.required_nodes:
        return (
            f"tensor_parallel_size × pipeline_parallel_size = {ranks} is smaller than "
            f"required_nodes = {spec.required_nodes}: some nodes would hold no rank"
        )
    return None
