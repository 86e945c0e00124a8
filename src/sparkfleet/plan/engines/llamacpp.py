"""llama.cpp: ``llama-server`` (or ``python -m llama_cpp.server``) on rank 0; ``rpc-server`` on
the other ranks, which rank 0 reaches through ``--rpc``."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from sparkfleet.plan.engines.base import RankContext, Readiness, conflicting_flag

if TYPE_CHECKING:
    from sparkfleet.spec.recipe import Recipe

RESERVED = ("-m", "--model", "--host", "--port", "--rpc", "--rpc_servers")


def _is_python_server(entrypoint: tuple[str, ...]) -> bool:
    return "llama_cpp.server" in entrypoint


class LlamaCpp:
    """llama.cpp's server on rank 0, RPC workers elsewhere."""

    name = "llama-cpp"
    default_port = 8080
    default_rendezvous_port = 50052
    default_entrypoint: tuple[str, ...] = ("llama-server",)
    host_ip_env: tuple[str, ...] = ()

    def check_recipe(self, recipe: Recipe) -> str | None:
        problem = conflicting_flag(recipe.args, RESERVED, self.name)
        if problem:
            return problem
        if not recipe.model.startswith("/") and recipe.composed_model is None:
            if not recipe.model_file:
                return "model_file: required for llama-cpp when model is a Hugging Face repo (the GGUF file name)"
            if not recipe.revision:
                # llama.cpp takes a file path: the snapshot folder must be known without asking the hub.
                return ("revision: required for llama-cpp when model is a Hugging Face repo (the snapshot "
                        "folder name under {{hf}}/hub/models--ORG--NAME/snapshots/)")
        return None

    def check_layout(self, recipe: Recipe) -> str | None:
        # Ranks above 0 are rpc-server backends that rank 0 drives over --rpc: they hold no tensor
        # or pipeline rank, so any required_nodes is a valid spread whatever TP/PP say.
        return None

    def rank_argv(self, recipe: Recipe, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        if ctx.rank > 0:
            # Its own fabric address, not 0.0.0.0: the RPC protocol has no authentication.
            return ("rpc-server", "--host", ctx.fabric_ip, "--port", str(ctx.rendezvous_port))
        python = _is_python_server(entrypoint)
        path = str(PurePosixPath(ctx.model_ref) / ctx.model_file) if ctx.model_file else ctx.model_ref
        argv = (*entrypoint, "--model", path, *recipe.args, "--host", "0.0.0.0", "--port", str(ctx.port))
        workers = [f"{ip}:{ctx.rendezvous_port}" for ip in ctx.peer_fabric_ips[1:]]
        if workers:
            argv += ("--rpc_servers" if python else "--rpc", ",".join(workers))
        return argv

    def readiness(self, ctx: RankContext) -> Readiness:
        if ctx.rank > 0:
            # rpc-server has no HTTP: it is ready once its port accepts a connection.
            return Readiness(False, None, r"Starting RPC server", tcp_port=ctx.rendezvous_port)
        # llama-server answers /health 503 while loading; llama_cpp.server has only /v1/models.
        return Readiness(True, "/v1/models", None)
