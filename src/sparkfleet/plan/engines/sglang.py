"""SGLang: one launch_server per node; only rank 0 serves HTTP."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkfleet.plan.engines.base import RankContext, Readiness, conflicting_flag, gpu_ranks_cover_nodes

if TYPE_CHECKING:
    from sparkfleet.spec.recipe import Recipe

RESERVED = (
    "--model-path", "--model", "--nnodes", "--node-rank", "--dist-init-addr", "--host", "--port",
    "--tp", "--tp-size", "--tensor-parallel-size", "--pp-size", "--pipeline-parallel-size",
)


class SGLang:
    """``python3 -m sglang.launch_server`` on every rank."""

    name = "sglang"
    default_port = 30000
    default_rendezvous_port = 20000
    default_entrypoint: tuple[str, ...] = ("python3", "-m", "sglang.launch_server")
    host_ip_env: tuple[str, ...] = ("SGLANG_HOST_IP",)

    def check_recipe(self, recipe: Recipe) -> str | None:
        return conflicting_flag(recipe.args, RESERVED, self.name)

    def check_layout(self, recipe: Recipe) -> str | None:
        return gpu_ranks_cover_nodes(recipe)

    def rank_argv(self, recipe: Recipe, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        parallel: tuple[str, ...] = ("--tp", str(recipe.tensor_parallel_size))
        if recipe.pipeline_parallel_size > 1:
            parallel += ("--pp-size", str(recipe.pipeline_parallel_size))
        return (
            *entrypoint,
            *recipe.args,
            "--model-path", ctx.model_ref,
            *parallel,
            "--nnodes", str(ctx.nnodes),
            "--node-rank", str(ctx.rank),
            "--dist-init-addr", f"{ctx.head_fabric_ip}:{ctx.rendezvous_port}",
            "--host", "0.0.0.0",
            "--port", str(ctx.port),
        )  # fmt: skip

    def readiness(self, ctx: RankContext) -> Readiness:
        if ctx.rank == 0:
            return Readiness(True, "/health", r"The server is fired up and ready to roll!")
        # Ranks above 0 answer /health from a dummy server that always says 200: not evidence.
        return Readiness(False, None, None)
