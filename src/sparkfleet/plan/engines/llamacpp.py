"""llama.cpp: ``llama-server`` (or ``python -m llama_cpp.server``) on rank 0; ``rpc-server`` on
the other ranks, which rank 0 reaches through ``--rpc``."""

from __future__ import annotations

from pathlib import PurePosixPath

from sparkfleet.plan.engines.base import AdapterDefaults, LaunchSpec, RankContext, Readiness, conflicting_flag

RESERVED = ("-m", "--model", "--host", "--port", "--rpc", "--rpc_servers")


def _is_python_server(entrypoint: tuple[str, ...]) -> bool:
    return "llama_cpp.server" in entrypoint


class LlamaCpp(AdapterDefaults):
    """llama.cpp's server on rank 0, RPC workers elsewhere."""

    name = "llama-cpp"
    default_port = 8080
    default_rendezvous_port = 50052
    default_entrypoint: tuple[str, ...] = ("llama-server",)
    host_ip_env: tuple[str, ...] = ()
    # llama-server names the model with --alias/-a, llama_cpp.server with --model_alias.
    served_name_flags: tuple[str, ...] = ("--alias", "-a", "--model_alias")

    def check_recipe(self, spec: LaunchSpec) -> str | None:
        problem = conflicting_flag(spec.args, RESERVED, self.name)
        if problem:
            return problem
        if not spec.model.startswith("/") and not spec.composed:
            if not spec.model_file:
                return "model_file: required for llama-cpp when model is a Hugging Face repo (the GGUF file name)"
            if not spec.revision:
                # llama.cpp takes a file path: the snapshot folder must be known without asking the hub.
                return ("revision: required for llama-cpp when model is a Hugging Face repo (the snapshot "
                        "folder name under {{hf}}/hub/models--ORG--NAME/snapshots/)")
        return None

    def check_layout(self, spec: LaunchSpec) -> str | None:
        # Ranks above 0 are rpc-server backends that rank 0 drives over --rpc: they hold no tensor
        # or pipeline rank, so any required_nodes is a valid spread whatever TP/PP say.
        return None

    def hub_model_ref(self, model: str, revision: str | None, hf_root: str) -> str:
        # llama.cpp opens a file: point it at the pinned snapshot in the Hugging Face cache.
        repo_dir = "models--" + model.replace("/", "--")
        return f"{hf_root.rstrip('/')}/hub/{repo_dir}/snapshots/{revision}"

    def rank_argv(self, spec: LaunchSpec, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        if ctx.rank > 0:
            # Its own fabric address, not 0.0.0.0: the RPC protocol has no authentication.
            return ("rpc-server", "--host", ctx.fabric_ip, "--port", str(ctx.rendezvous_port))
        python = _is_python_server(entrypoint)
        path = str(PurePosixPath(ctx.model_ref) / ctx.model_file) if ctx.model_file else ctx.model_ref
        argv = (*entrypoint, "--model", path, *spec.args, "--host", "0.0.0.0", "--port", str(ctx.port))
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
