"""SGLang: one launch_server per node; only rank 0 serves HTTP."""

from __future__ import annotations

from collections.abc import Sequence

from sparkfleet.plan.engines.base import (
    AbortRoute,
    AdapterDefaults,
    LaunchSpec,
    MemoryRules,
    RankContext,
    Readiness,
    conflicting_flag,
    gpu_ranks_cover_nodes,
    head_first,
    reserved_flags,
    revision_flags,
    sparkrun_style_args,
)
from sparkfleet.plan.flags import flag_value

TP_FLAGS = ("--tp", "--tp-size", "--tensor-parallel-size")
PP_FLAGS = ("--pp-size", "--pipeline-parallel-size")
# The flags a sparkrun-style recipe keeps in args (values replaced per rank, sparkrun_style_args).
SPARKRUN_STYLE_OWN = (*TP_FLAGS, *PP_FLAGS, "--host", "--port")
RESERVED = ("--model-path", "--model", "--nnodes", "--node-rank", "--dist-init-addr", *SPARKRUN_STYLE_OWN)
# CUDA graphs: knapcio measured ~5.6 GB for SGLang decode graphs up to batch 16.
SGLANG_GRAPH_BYTES_PER_BS = 5.6e9 / 16
# SGLang's DeepSeek-V4 indexer scores each prefill chunk against the whole compressed prefix:
# peak ≈ 14 B × chunk × prefix (measured, MiaAI docs/chunked-prefill-memory.md).
DSV4_INDEXER_BYTES_PER_TOKEN2 = 14.0


def _int_flag(argv: Sequence[str], flag: str) -> int | None:
    text = flag_value(argv, flag)
    return int(float(text)) if text not in (None, "") else None


class SGLang(AdapterDefaults):
    """``python3 -m sglang.launch_server`` on every rank."""

    name = "sglang"
    default_port = 30000
    default_rendezvous_port = 20000
    default_entrypoint: tuple[str, ...] = ("python3", "-m", "sglang.launch_server")
    host_ip_env: tuple[str, ...] = ("SGLANG_HOST_IP",)
    memory: MemoryRules | None = MemoryRules(
        fraction_flag="--mem-fraction-static",
        fraction_default=0.88,
        chunk_flag="--chunked-prefill-size",
        chunk_default=8192,
        context_flag="--context-length",
        kv_tokens_flag="--max-total-tokens",
    )
    # The route the seeds' memguard.py uses.
    abort_route: AbortRoute | None = AbortRoute("/abort_request", (("abort_all", True),))

    def check_recipe(self, spec: LaunchSpec) -> str | None:
        return conflicting_flag(spec.args, reserved_flags(spec, RESERVED, SPARKRUN_STYLE_OWN), self.name)

    def check_layout(self, spec: LaunchSpec) -> str | None:
        return gpu_ranks_cover_nodes(spec)

    def rank_argv(self, spec: LaunchSpec, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        args = spec.args
        if spec.command_style == "sparkrun":
            # The recipe's own --tp-size/--pp-size/--host/--port, values this plan's.
            args = sparkrun_style_args(
                args, ((TP_FLAGS, spec.tensor_parallel_size), (PP_FLAGS, spec.pipeline_parallel_size)),
                ("--host",), ("--port",), ctx, self.default_port,
            )  # fmt: skip
        parallel: tuple[str, ...] = ("--tp", str(spec.tensor_parallel_size))
        if spec.pipeline_parallel_size > 1:
            parallel += ("--pp-size", str(spec.pipeline_parallel_size))
        # One node has no rendezvous: SGLang's defaults (one node, rank 0) hold, as sparkrun's solo
        # launch leaves them.
        rendezvous: tuple[str, ...] = (
            ("--nnodes", str(ctx.nnodes), "--node-rank", str(ctx.rank),
             "--dist-init-addr", f"{ctx.head_fabric_ip}:{ctx.rendezvous_port}")
            if ctx.nnodes > 1
            else ()
        )  # fmt: skip
        if spec.command_style == "sparkrun":
            return (*entrypoint, *args, "--model-path", ctx.model_ref, *revision_flags(spec, ctx.model_ref),
                    *rendezvous)  # fmt: skip
        return (
            *entrypoint,
            *args,
            "--model-path", ctx.model_ref,
            *revision_flags(spec, ctx.model_ref),
            *parallel,
            *rendezvous,
            "--host", ctx.bind_ip,
            "--port", str(ctx.port),
        )  # fmt: skip

    def stop_waves(self, nnodes: int) -> tuple[tuple[int, ...], ...]:
        # Seen with SGLang 0.5.23: a worker rank ignores SIGTERM until rank 0 broadcasts
        # shutdown, and SIGTERM to rank 0 stops both ranks' trees. Workers that outlive the
        # grace period (rank 0 killed) get SIGKILL.
        return head_first(nnodes)

    def readiness(self, ctx: RankContext) -> Readiness:
        if ctx.rank == 0:
            return Readiness(True, "/health", r"The server is fired up and ready to roll!")
        # Ranks above 0 answer /health from a dummy server that always says 200: not evidence.
        return Readiness(False, None, None)

    def cuda_graphs(self, argv: Sequence[str]) -> tuple[int, str]:
        bs = (
            _int_flag(argv, "--cuda-graph-max-bs-decode")
            or _int_flag(argv, "--cuda-graph-max-bs")
            or _int_flag(argv, "--max-running-requests")
            or 16
        )
        return int(SGLANG_GRAPH_BYTES_PER_BS * bs), f"estimate: 5.6 GB per 16 decode batch sizes (knapcio), max bs {bs}"

    def prefill_bytes_per_token2(self, model: str, parent_model: str | None) -> float | None:
        """14 B/token² serving a DeepSeek-V4 family model (its indexer), else unknown."""
        names = f"{model} {parent_model or ''}".lower()
        return DSV4_INDEXER_BYTES_PER_TOKEN2 if "deepseek-v4" in names else None
