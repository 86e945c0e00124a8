"""llama.cpp: ``llama-server`` (or ``python -m llama_cpp.server``) on rank 0; ``rpc-server`` on
the other ranks, which rank 0 reaches through ``--rpc``.

Two servers speak for llama.cpp, told apart by the entrypoint:

- The native ``llama-server`` (llama.cpp's own C++ server, what users run on GPUs). It starts
  its HTTP listener before loading the model: connection refused for a moment, then ``/health``
  (and ``/v1/models``) answer 503 ``{"error": {"code": 503, "message": "Loading model"}}`` until
  the model is loaded, then ``/health`` answers 200 ``{"status": "ok"}``. Readiness is that 200.
  It names the model in responses after ``--alias`` (``-a``), else ``gpt-3.5-turbo``, and lists
  the file path in ``/v1/models``; sparkfleet passes ``--alias`` with the served name unless the
  recipe's args set it, so the model id a client is told is the one the server answers to. A
  stream's final chunk (empty text or delta, ``finish_reason``) carries ``usage`` and
  llama.cpp's own ``timings`` (``predicted_per_second``, …), with or without
  ``stream_options.include_usage``. SIGTERM after serving ends it with SIGABRT (exit 134 from a
  shell): what a stop looks like, not a crash.
- llama-cpp-python's ``llama_cpp.server`` (uvicorn): no ``/health``, ``/v1/models`` answers once
  the model is loaded; the served name is ``--model_alias``; its streams carry no ``usage``, so
  the bench refuses it.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from sparkfleet.plan.engines.base import (
    AdapterDefaults,
    LaunchSpec,
    RankContext,
    Readiness,
    conflicting_flag,
    head_first,
)
from sparkfleet.plan.flags import first_present

RESERVED = ("-m", "--model", "--host", "--port", "--rpc", "--rpc_servers")
NATIVE_ALIAS_FLAGS = ("--alias", "-a")
PYTHON_ALIAS_FLAGS = ("--model_alias",)
# What the native server's log prints once it serves (after "main: model loaded").
NATIVE_READY_LOG = r"server is listening on http://\S+ - starting the main loop"


def is_python_server(entrypoint: tuple[str, ...]) -> bool:
    """True for llama-cpp-python's ``python -m llama_cpp.server``, False for ``llama-server``."""
    return "llama_cpp.server" in entrypoint


def rpc_server_for(entrypoint: tuple[str, ...]) -> str:
    """The workers' ``rpc-server``: beside a ``llama-server`` named by its path (a build folder, as
    ``scripts/setup-engines.sh`` makes), else the one on the node's PATH (an image's)."""
    head = PurePosixPath(entrypoint[0]) if entrypoint else None
    if head is not None and head.name == "llama-server" and len(head.parts) > 1:
        return str(head.with_name("rpc-server"))
    return "rpc-server"


class LlamaCpp(AdapterDefaults):
    """llama.cpp's server on rank 0, RPC workers elsewhere."""

    name = "llama-cpp"
    default_port = 8080
    default_rendezvous_port = 50052
    default_entrypoint: tuple[str, ...] = ("llama-server",)
    host_ip_env: tuple[str, ...] = ()
    # llama-server names the model with --alias/-a, llama_cpp.server with --model_alias.
    served_name_flags: tuple[str, ...] = (*NATIVE_ALIAS_FLAGS, *PYTHON_ALIAS_FLAGS)

    def check_recipe(self, spec: LaunchSpec) -> str | None:
        if spec.command_style != "sparkfleet":
            return f"command_style: {spec.command_style!r} applies to vllm and sglang; llama-cpp has only 'sparkfleet'"
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

    def hub_profile(self, spec: LaunchSpec) -> tuple[str, str | None]:
        # llama.cpp opens one GGUF file: the chosen quant, never the repo's other quants.
        return ("gguf", spec.model_file)

    def rank_argv(self, spec: LaunchSpec, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        if ctx.rank > 0:
            # Its own fabric address, not 0.0.0.0: the RPC protocol has no authentication.
            return (rpc_server_for(entrypoint), "--host", ctx.fabric_ip, "--port", str(ctx.rendezvous_port))
        python = is_python_server(entrypoint)
        path = str(PurePosixPath(ctx.model_ref) / ctx.model_file) if ctx.model_file else ctx.model_ref
        argv = (*entrypoint, "--model", path, *spec.args)
        if first_present(spec.args, self.served_name_flags) is None:
            # Without it the server answers to its file path (or gpt-3.5-turbo), not the plan's name.
            argv += (PYTHON_ALIAS_FLAGS[0] if python else NATIVE_ALIAS_FLAGS[0], self.served_model(spec))
        argv += ("--host", ctx.bind_ip, "--port", str(ctx.port))
        workers = [f"{ip}:{ctx.rendezvous_port}" for ip in ctx.peer_fabric_ips[1:]]
        if workers:
            argv += ("--rpc_servers" if python else "--rpc", ",".join(workers))
        return argv

    def stop_waves(self, nnodes: int) -> tuple[tuple[int, ...], ...]:
        # llama-server aborts (GGML_ABORT) when an rpc-server it holds goes away mid-request:
        # stop the server first, then the rpc-servers it used.
        return head_first(nnodes)

    def readiness(self, ctx: RankContext) -> Readiness:
        if ctx.rank > 0:
            # rpc-server has no HTTP: it is ready once its port accepts a connection.
            return Readiness(False, None, r"Starting RPC server", tcp_port=ctx.rendezvous_port)
        if is_python_server(ctx.entrypoint):
            # llama_cpp.server has no /health; /v1/models answers once the model is loaded.
            return Readiness(True, "/v1/models", None)
        # llama-server answers /health 503 "Loading model" while loading, 200 once it serves.
        return Readiness(True, "/health", NATIVE_READY_LOG)
