"""The per-rank memory model: will this rank fit, and with how much headroom?

Pure: every figure comes from the planned argv and env, the Plan's ``MemorySpec`` (the
recipe's ``[memory]`` table), the model config or checkpoint headers, and the node's facts. The
engine's own flags and estimates come from its adapter (``MemoryRules``, ``cuda_graphs``). The
layout follows the engines:

    device memory  = the GPU's framebuffer, or on unified memory (DGX Spark) MemAvailable
    static pool    = memory fraction × device memory      (engine flag)
        weights per rank + KV pool + CUDA graphs          must fit inside it
    outside pool   = device memory − static pool
        NCCL pinned buffers + prefill transient + head-only overhead  must fit there

Constants below are NCCL's own defaults or figures measured in the seed deployments; each says
where it comes from.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkfleet.plan.engines import engine_for
from sparkfleet.plan.flags import flag_value

if TYPE_CHECKING:
    from sparkfleet.doctor.probes.gpu import GpuFacts
    from sparkfleet.doctor.probes.meminfo import MemInfo
    from sparkfleet.plan.model import MemorySpec, Plan, RankPlan

GIB = 1024**3
MIB = 1024**2

# NCCL per-connection buffers (src/include/device.h defaults): Simple = NCCL_BUFFSIZE (4 MiB);
# LL128 = 120 elems/thread x 640 threads x 8 steps x 8 B = 4.6875 MiB; LL = 8 lines/thread x
# 512 threads x 8 steps x 16 B = 0.5 MiB.
NCCL_SIMPLE_DEFAULT = 4 * MIB
NCCL_LL128_DEFAULT = 120 * 640 * 8 * 8
NCCL_LL_DEFAULT = 8 * 512 * 8 * 16
NCCL_MAX_CHANNELS = 32
# The seeds counted 512 connections per node with default channels on a DGX Spark ring
# (TP3/TP4); that is 16 per channel, and the count scales with the channel cap.
NCCL_CONNECTIONS_PER_CHANNEL = 16

# With DSV41_INDEXER_CHUNKED=1 (sglang#39187 backport) the fp32 logits (4 of the 14 B) are
# scored in row chunks of at most DSV41_INDEXER_LOGITS_BUDGET_BYTES, which bounds the peak.
DSV4_INDEXER_LOGITS_BUDGET_DEFAULT = 2 * GIB

# Rank 0 runs the HTTP server, tokenizer and detokenizer: ~1.3 GiB measured on SGLang TP3.
HEAD_OVERHEAD_DEFAULT = int(1.3 * GIB)
_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bf16": 2, "bfloat16": 2, "float16": 2, "auto": 2}


@dataclass(frozen=True)
class NcclEstimate:
    """Pinned NCCL buffers of one node, and how they were counted."""

    bytes: int
    connections: int
    per_connection: int
    protocols: tuple[str, ...]
    detail: str


def _nccl_protocols(spec: str | None) -> tuple[str, ...]:
    every = ("Simple", "LL128", "LL")
    if not spec:
        return every
    negate = spec.startswith("^")
    named = {p.strip().lower() for p in spec.lstrip("^").split(",") if p.strip()}
    return tuple(p for p in every if (p.lower() in named) != negate)


def nccl_pinned(env: Mapping[str, str]) -> NcclEstimate:
    """Pinned NCCL connection buffers per node from the NCCL_* environment.

    buffers per connection (one per enabled protocol) × connections, where connections =
    16 per channel × channels (32 unless NCCL_MAX_NCHANNELS/NCCL_MIN_NCHANNELS say otherwise).
    """
    sizes = {
        "Simple": int(env.get("NCCL_BUFFSIZE") or NCCL_SIMPLE_DEFAULT),
        "LL128": int(env.get("NCCL_LL128_BUFFSIZE") or NCCL_LL128_DEFAULT),
        "LL": int(env.get("NCCL_LL_BUFFSIZE") or NCCL_LL_DEFAULT),
    }
    protocols = _nccl_protocols(env.get("NCCL_PROTO"))
    channels = NCCL_MAX_CHANNELS
    if env.get("NCCL_MAX_NCHANNELS"):
        channels = min(channels, int(env["NCCL_MAX_NCHANNELS"]))
    if env.get("NCCL_MIN_NCHANNELS"):
        channels = max(channels, int(env["NCCL_MIN_NCHANNELS"]))
    connections = NCCL_CONNECTIONS_PER_CHANNEL * channels
    per_connection = sum(sizes[p] for p in protocols)
    parts = " + ".join(f"{p} {sizes[p] / MIB:.4g} MiB" for p in protocols)
    return NcclEstimate(
        bytes=per_connection * connections,
        connections=connections,
        per_connection=per_connection,
        protocols=protocols,
        detail=f"{connections} connections ({channels} channels) × ({parts})",
    )


def prefill_transient(coefficient: float, chunk: int, prefix: int, env: Mapping[str, str]) -> tuple[int, str]:
    """Peak prefill transient ≈ coefficient × chunk × prefix bytes, bounded by the chunked
    indexer's logits budget when DSV41_INDEXER_CHUNKED=1."""
    raw = int(coefficient * chunk * prefix)
    detail = f"{coefficient:g} B × chunk {chunk} × prefix {prefix}"
    if env.get("DSV41_INDEXER_CHUNKED") == "1":
        budget = int(env.get("DSV41_INDEXER_LOGITS_BUDGET_BYTES") or DSV4_INDEXER_LOGITS_BUDGET_DEFAULT)
        bound = int(budget * coefficient / 4)  # logits are 4 of the 14 B per score
        if bound < raw:
            return bound, (
                f"{detail} = {raw / 1e9:.1f} GB, bounded by DSV41_INDEXER_CHUNKED to "
                f"{coefficient:g}/4 × {budget / GIB:g} GiB logits budget"
            )
    return raw, detail


def kv_bytes_per_token(config: Mapping[str, Any], tp: int, dtype_bytes: float) -> float:
    """KV cache bytes per token per rank from a Hugging Face config.json.

    MLA (kv_lora_rank present): layers × (kv_lora_rank + qk_rope_head_dim) × dtype, the latent
    replicated on every rank. MHA/GQA: 2 × layers × kv heads per rank × head_dim × dtype, where
    kv heads per rank = max(1, kv_heads / tp).
    """
    text = config.get("text_config")
    cfg: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    layers = int(cfg["num_hidden_layers"])
    if cfg.get("kv_lora_rank"):
        latent = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
        return layers * latent * dtype_bytes
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    per_rank = max(1.0, kv_heads / tp)
    return 2 * layers * per_rank * head_dim * dtype_bytes


def weights_per_rank(tensors: Mapping[str, int], tp: int, exclude: Sequence[str] = ()) -> int:
    """Resident weight bytes per rank: every tensor not matched by `exclude` (e.g. tables
    served from disk), split evenly over TP ranks. Expert parallelism moves experts between
    ranks but leaves the per-rank share the same, so EP does not enter."""
    kept = sum(size for name, size in tensors.items() if not any(fnmatch.fnmatch(name, p) for p in exclude))
    return kept // max(1, tp)


@dataclass(frozen=True)
class MemoryInputs:
    """Everything the model needs about one rank, already gathered."""

    engine: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    rank: int
    tp: int
    nnodes: int
    device_memory: int | None
    device_source: str
    kv_bytes_per_token: float | None = None
    weights_per_rank: int | None = None
    weights_source: str = ""
    cuda_graph: int | None = None
    prefill_bytes_per_token2: float | None = None
    head_overhead: int | None = None


@dataclass(frozen=True)
class MemoryItem:
    """One line of the plan: what, how many bytes, in or outside the static pool, and why."""

    name: str
    bytes: int | None
    region: str
    detail: str


@dataclass(frozen=True)
class MemoryPlan:
    """One rank's memory plan; `fits` is None when a needed figure is unknown."""

    rank: int
    device_memory: int | None
    device_source: str
    fraction: float | None
    static_pool: int | None
    items: tuple[MemoryItem, ...]
    pool_headroom: int | None
    outside_headroom: int | None
    fits: bool | None
    notes: tuple[str, ...]

    @property
    def headroom(self) -> int | None:
        known = [h for h in (self.pool_headroom, self.outside_headroom) if h is not None]
        return min(known) if known else None

    @property
    def total_need(self) -> int | None:
        """Pool plus everything outside it: what the node must have free before launch."""
        outside = [i.bytes for i in self.items if i.region == "outside"]
        if self.static_pool is None or any(b is None for b in outside):
            return None
        return self.static_pool + sum(b for b in outside if b is not None)

    def item(self, name: str) -> MemoryItem:
        """The line called name."""
        for it in self.items:
            if it.name == name:
                return it
        raise KeyError(name)


def _int_flag(argv: Sequence[str], flag: str | None) -> int | None:
    text = flag_value(argv, flag) if flag else None
    return int(float(text)) if text not in (None, "") else None


def plan_memory(inp: MemoryInputs) -> MemoryPlan:
    """The memory plan of one rank (see the module docstring for the layout)."""
    argv, env = inp.argv, dict(inp.env)
    notes: list[str] = []
    items: list[MemoryItem] = []
    adapter = engine_for(inp.engine)
    rules = adapter.memory

    fraction: float | None = None
    if rules:
        text = flag_value(argv, rules.fraction_flag)
        fraction = float(text) if text else rules.fraction_default
        if not text:
            notes.append(f"{rules.fraction_flag} not set: assumed the engine default {fraction}")
    pool = int(fraction * inp.device_memory) if fraction is not None and inp.device_memory else None

    weights = inp.weights_per_rank
    wdetail = inp.weights_source or "unknown: no checkpoint headers and no [memory] weights_per_rank"
    items.append(MemoryItem("weights", weights, "pool", wdetail))

    if inp.cuda_graph is not None:
        graphs, graph_detail = inp.cuda_graph, "[memory] cuda_graph"
    else:
        graphs, graph_detail = adapter.cuda_graphs(argv)
    items.append(MemoryItem("cuda_graphs", graphs, "pool", graph_detail))

    tokens = _int_flag(argv, rules.kv_tokens_flag) if rules else None
    kv_mem = _int_flag(argv, rules.kv_bytes_flag) if rules else None
    bpt = inp.kv_bytes_per_token
    if tokens is not None and bpt is not None and rules:
        kv: int | None = int(tokens * bpt)
        kv_detail = f"{tokens:,} tokens × {bpt:,.2f} B (pinned by {rules.kv_tokens_flag})"
    elif kv_mem is not None and rules:
        kv, kv_detail = kv_mem, str(rules.kv_bytes_flag)
    else:
        kv = None
        kv_detail = "not pinned: the engine takes what is left of the pool"
    pool_fixed = [b for b in (weights, graphs) if b is not None]
    if kv is None and pool is not None and weights is not None:
        left = pool - sum(pool_fixed)
        capacity = f" ≈ {int(left / bpt):,} tokens" if bpt and left > 0 else ""
        kv_detail += f"{capacity}"
        items.append(MemoryItem("kv_cache", max(left, 0), "pool", kv_detail))
        # Unpinned, the engine gives the KV pool whatever is left: the pool fits while that is >= 0.
        pool_headroom: int | None = left
        if bpt and left > 0:
            context = _int_flag(argv, rules.context_flag if rules else None)
            if context and left / bpt < context:
                notes.append(f"the KV pool holds ≈{int(left / bpt):,} tokens, less than one {context:,}-token request")
    else:
        items.append(MemoryItem("kv_cache", kv, "pool", kv_detail))
        in_pool = [weights, graphs, kv]
        pool_headroom = None
        if pool is not None and None not in in_pool:
            pool_headroom = pool - sum(b for b in in_pool if b is not None)

    nccl: NcclEstimate | None = nccl_pinned(env) if inp.nnodes > 1 or inp.tp > 1 else None
    ndetail = nccl.detail if nccl else "single rank: no NCCL peers"
    items.append(MemoryItem("nccl_buffers", nccl.bytes if nccl else 0, "outside", ndetail))

    coeff = inp.prefill_bytes_per_token2
    chunk = (_int_flag(argv, rules.chunk_flag) or rules.chunk_default) if rules else 0
    context = _int_flag(argv, rules.context_flag if rules else None)
    if coeff and chunk and context:
        transient, tdetail = prefill_transient(coeff, chunk, context, env)
        tdetail += " (a full-context prompt)"
    elif coeff and not context:
        transient, tdetail = None, f"unknown: no {rules.context_flag if rules else 'context'} flag"
    else:
        transient, tdetail = 0, "none known for this model ([memory] prefill_bytes_per_token2)"
    items.append(MemoryItem("prefill_transient", transient, "outside", tdetail))

    head = 0
    if inp.rank == 0:
        head = inp.head_overhead if inp.head_overhead is not None else HEAD_OVERHEAD_DEFAULT
    hdetail = "HTTP server, tokenizer, detokenizer (rank 0)" if inp.rank == 0 else "not the head"
    items.append(MemoryItem("head_overhead", head, "outside", hdetail))

    outside_need = [i.bytes for i in items if i.region == "outside"]
    outside_headroom = (
        inp.device_memory - pool - sum(b for b in outside_need if b is not None)
        if pool is not None and inp.device_memory is not None and None not in outside_need
        else None
    )
    if pool is None:
        notes.append("no device memory figure: the pool cannot be sized")
    # One region known to overflow is enough for "does not fit"; "fits" needs both known.
    known = [h for h in (pool_headroom, outside_headroom) if h is not None]
    fits: bool | None = None
    if any(h < 0 for h in known):
        fits = False
    elif len(known) == 2:
        fits = True
    return MemoryPlan(
        rank=inp.rank,
        device_memory=inp.device_memory,
        device_source=inp.device_source,
        fraction=fraction,
        static_pool=pool,
        items=tuple(items),
        pool_headroom=pool_headroom,
        outside_headroom=outside_headroom,
        fits=fits,
        notes=tuple(notes),
    )


def gb(num: int | float | None) -> str:
    """'13.37 GB (12.45 GiB)': the seeds quote both units, so the rendering shows both."""
    if num is None:
        return "unknown"
    return f"{num / 1e9:.2f} GB ({num / GIB:.2f} GiB)"


def render_memory_plan(mp: MemoryPlan) -> list[str]:
    """Plain lines for `sparkfleet plan` and `doctor`."""
    frac = f"{mp.fraction:g} × " if mp.fraction is not None else ""
    lines = [
        f"rank {mp.rank}: device memory {gb(mp.device_memory)} [{mp.device_source}]",
        f"  static pool = {frac}device = {gb(mp.static_pool)}",
    ]
    for region, title in (("pool", "inside the pool"), ("outside", "outside the pool")):
        lines.append(f"  {title}:")
        for it in mp.items:
            if it.region == region:
                lines.append(f"    {it.name:<18} {gb(it.bytes):<28} {it.detail}")
    verdict = {True: "fits", False: "does NOT fit", None: "unknown"}[mp.fits]
    lines.append(f"  verdict: {verdict}; headroom in pool {gb(mp.pool_headroom)}, outside {gb(mp.outside_headroom)}")
    lines += [f"  note: {n}" for n in mp.notes]
    return lines


def usable_memory(gpu: GpuFacts | None, meminfo: MemInfo | None) -> tuple[int | None, str]:
    """The memory one rank of a node can plan with, and where the figure came from: the first
    GPU's framebuffer; on unified memory (DGX Spark, GB10: NVML reports no framebuffer) and on
    CPU nodes the OS's MemAvailable, since the page cache and whatever already runs compete with
    CUDA allocations for the one pool. The one answer for plan and doctor."""
    if gpu and gpu.gpus and gpu.gpus[0].memory_total_mib is not None:
        return gpu.gpus[0].memory_total_mib * MIB, f"nvidia-smi memory.total of {gpu.gpus[0].name}"
    if meminfo:
        what = "unified memory: MemAvailable" if gpu and gpu.gpus else "no GPU: MemAvailable"
        return meminfo.available, what
    return None, "unknown"


def device_memory(spec: MemorySpec, gpu: GpuFacts | None, meminfo: MemInfo | None) -> tuple[int | None, str]:
    """The memory one rank plans with, and where the figure came from: the recipe's
    `[memory] device_memory`, else what the node's facts say is usable (`usable_memory`)."""
    if spec.device_memory:
        return spec.device_memory, "[memory] device_memory"
    return usable_memory(gpu, meminfo)


def memory_plan(
    plan_rank: RankPlan,
    spec: MemorySpec,
    *,
    gpu: GpuFacts | None = None,
    meminfo: MemInfo | None = None,
    tensors: Mapping[str, int] | None = None,
    model_config: Mapping[str, Any] | None = None,
) -> MemoryPlan:
    """The memory plan of one planned rank on its node (spec: the Plan's ``memory``).

    Weights come from `[memory] weights_per_rank`, else the checkpoint's tensor sizes
    (`tensors`, from safetensors headers) split over TP; KV bytes per token from
    `[memory] kv_bytes_per_token`, else the model config.
    """
    tp = spec.tp
    device, source = device_memory(spec, gpu, meminfo)
    weights, wsource = None, ""
    if spec.weights_per_rank is not None:
        weights, wsource = spec.weights_per_rank, "[memory] weights_per_rank"
    elif tensors:
        weights = weights_per_rank(tensors, tp, spec.weights_exclude)
        wsource = f"safetensors headers: {len(tensors)} tensors / TP {tp}"
        if spec.weights_exclude:
            wsource += f", without {', '.join(spec.weights_exclude)}"
    bpt = spec.kv_bytes_per_token
    if bpt is None and model_config is not None:
        dtype = flag_value(plan_rank.argv, "--kv-cache-dtype") or "auto"
        bpt = kv_bytes_per_token(model_config, tp, _DTYPE_BYTES.get(dtype, 2))
    return plan_memory(
        MemoryInputs(
            engine=spec.engine,
            argv=plan_rank.argv,
            env=tuple((e.key, e.value) for e in plan_rank.env),
            rank=plan_rank.rank,
            tp=tp,
            nnodes=spec.nnodes,
            device_memory=device,
            device_source=source,
            kv_bytes_per_token=bpt,
            weights_per_rank=weights,
            weights_source=wsource,
            cuda_graph=spec.cuda_graph,
            prefill_bytes_per_token2=spec.prefill_bytes_per_token2,
            head_overhead=spec.head_overhead,
        )
    )


def render_memory_plans(plans: Sequence[tuple[str, MemoryPlan]]) -> list[str]:
    """Several ranks' plans, each labelled with its node; a rank whose plan equals an earlier
    one is shown as a reference to it."""
    lines: list[str] = []
    shown: dict[tuple[object, ...], str] = {}
    for node, mp in plans:
        key = (mp.items, mp.static_pool, mp.device_memory, mp.fits)
        if key in shown:
            lines.append(f"rank {mp.rank} on {node}: same as {shown[key]}")
            continue
        shown[key] = f"rank {mp.rank}"
        first, *rest = render_memory_plan(mp)
        lines += [first.replace(f"rank {mp.rank}:", f"rank {mp.rank} on {node}:", 1), *rest]
    return lines


def plan_memory_lines(plan: Plan) -> list[str]:
    """The memory plan of every GPU rank as `sparkfleet plan` prints it, from the recipe alone
    (no node facts: device memory comes from `[memory] device_memory`; doctor uses the
    node's). Workers with the same plan are shown once."""
    if engine_for(plan.engine).memory is None:
        return []
    plans = [(r.node.name, memory_plan(r, plan.memory)) for r in plan.ranks if r.node.gpus != "none"]
    lines = render_memory_plans(plans)
    if lines and plan.memory.device_memory is None:
        lines.append("(device memory unknown here: set [memory] device_memory, or run `sparkfleet doctor`)")
    return lines
