"""vLLM: the ``mp`` backend runs ``vllm serve`` on every node (``--headless`` above rank 0);
the ``ray`` backend joins every node to a Ray cluster and serves from the head."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from sparkfleet.plan.engines.base import RankContext, Readiness, conflicting_flag, flag_names, gpu_ranks_cover_nodes

if TYPE_CHECKING:
    from sparkfleet.spec.recipe import Recipe

RESERVED = (
    "--model", "--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port", "--headless",
    "--host", "--port", "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
)
RAY_PORT_OFFSET = 0


class VLLM:
    """``vllm serve`` per rank (mp) or on the Ray head (ray)."""

    name = "vllm"
    default_port = 8000
    default_rendezvous_port = 29501
    default_entrypoint: tuple[str, ...] = ("vllm", "serve")
    host_ip_env: tuple[str, ...] = ("VLLM_HOST_IP",)

    def check_recipe(self, recipe: Recipe) -> str | None:
        problem = conflicting_flag(recipe.args, RESERVED, self.name)
        if problem:
            return problem
        if recipe.distributed_backend == "ray" and "--distributed-executor-backend" in flag_names(recipe.args):
            args = list(recipe.args)
            value = args[args.index("--distributed-executor-backend") + 1 :][:1]
            if value != ["ray"]:
                return "args: --distributed-executor-backend contradicts distributed_backend = \"ray\""
        return None

    def _serve(self, recipe: Recipe, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        return (
            *entrypoint,
            ctx.model_ref,
            *recipe.args,
            "--tensor-parallel-size", str(recipe.tensor_parallel_size),
            "--pipeline-parallel-size", str(recipe.pipeline_parallel_size),
        )  # fmt: skip

    def check_layout(self, recipe: Recipe) -> str | None:
        return gpu_ranks_cover_nodes(recipe)

    def rank_argv(self, recipe: Recipe, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        if recipe.distributed_backend == "ray" and ctx.nnodes > 1:
            return self._ray_argv(recipe, entrypoint, ctx)
        argv = self._serve(recipe, entrypoint, ctx)
        if ctx.nnodes > 1:
            argv += (
                "--nnodes", str(ctx.nnodes),
                "--node-rank", str(ctx.rank),
                "--master-addr", ctx.head_fabric_ip,
                "--master-port", str(ctx.rendezvous_port),
            )  # fmt: skip
        if ctx.rank > 0:
            return (*argv, "--headless")
        return (*argv, "--host", "0.0.0.0", "--port", str(ctx.port))

    def _ray_argv(self, recipe: Recipe, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        address = f"{ctx.head_fabric_ip}:{ctx.rendezvous_port}"
        if ctx.rank > 0:
            # Workers may start before the head; keep trying to join until it answers.
            join = (
                f"until ray start --block --address={shlex.quote(address)} "
                f"--node-ip-address={shlex.quote(ctx.fabric_ip)}; do sleep 2; done"
            )
            return ("bash", "-c", join)
        serve = self._serve(recipe, entrypoint, ctx)
        if "--distributed-executor-backend" not in flag_names(recipe.args):
            serve += ("--distributed-executor-backend", "ray")
        serve += ("--host", "0.0.0.0", "--port", str(ctx.port))
        wait_nodes = (
            "import ray,sys; ray.init(address='auto', logging_level='ERROR'); "
            f"sys.exit(0 if sum(n['Alive'] for n in ray.nodes()) >= {ctx.nnodes} else 1)"
        )
        script = (
            f"ray start --head --port={ctx.rendezvous_port} --node-ip-address={shlex.quote(ctx.fabric_ip)}"
            f" && until python3 -c {shlex.quote(wait_nodes)}; do sleep 2; done"
            f" && exec {shlex.join(serve)}"
        )
        return ("bash", "-c", script)

    def readiness(self, ctx: RankContext) -> Readiness:
        if ctx.rank == 0:
            return Readiness(True, "/health", r"Application startup complete")
        return Readiness(False, None, None)
