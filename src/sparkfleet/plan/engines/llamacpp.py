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
    set_in_place,
    sparkrun_style_args,
)
from sparkfleet.plan.flags import first_present, flag_name, is_flag, normal, without

RESERVED = ("-m", "--model", "--host", "--port", "--rpc", "--rpc_servers")
# In sparkrun style args keep the model, host and port flags (plan sets their values); only the
# worker list stays the launcher's.
SPARKRUN_RESERVED = ("--rpc", "--rpc_servers")
HF_FLAGS = ("-hf", "-hfr", "--hf-repo")
MODEL_FLAGS = ("-m", "--model")
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
        sparkrun = spec.command_style == "sparkrun"
        problem = conflicting_flag(spec.args, SPARKRUN_RESERVED if sparkrun else RESERVED, self.name)
        if problem:
            return problem
        if sparkrun and not spec.model.startswith("/") and not spec.composed:
            if spec.model_file is None:
                # llama.cpp downloads the model itself at start (-hf repo[:QUANT]).
                return None
            if ":" in spec.model:
                return (f"model: {spec.model!r} is a repo:QUANT spec, which llama.cpp downloads itself; "
                        "with model_file set, write the repo alone")  # fmt: skip
        if not spec.model.startswith("/") and not spec.composed:
            if not spec.model_file:
                return "model_file: required for llama-cpp when model is a Hugging Face repo (the GGUF file name)"
            if not spec.revision:
                # llama.cpp takes a file path: the snapshot folder must be known without asking the hub.
                return (
                    "revision: required for llama-cpp when model is a Hugging Face repo (the snapshot "
                    "folder name under {{hf}}/hub/models--ORG--NAME/snapshots/)"
                )
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

    def fetches_at_start(self, spec: LaunchSpec) -> bool:
        # An imported sparkrun recipe whose model is -hf repo[:QUANT] with no pinned file:
        # llama-server fetches the GGUF itself on each start, as sparkrun's dry run renders it.
        return (spec.command_style == "sparkrun" and not spec.composed and not spec.model.startswith("/")
                and spec.model_file is None)  # fmt: skip

    def rank_argv(self, spec: LaunchSpec, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        if ctx.rank > 0:
            # Its own fabric address, not 0.0.0.0: the RPC protocol has no authentication.
            return (rpc_server_for(entrypoint), "--host", ctx.fabric_ip, "--port", str(ctx.rendezvous_port))
        if spec.command_style == "sparkrun":
            return self._sparkrun_argv(spec, entrypoint, ctx)
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

    def _sparkrun_argv(self, spec: LaunchSpec, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        """An imported sparkrun recipe's llama-server: the command as sparkrun renders it, the
        model, host and port flags where the recipe wrote them with this plan's values, no
        --alias added (sparkrun appends it only for a served_model_name, which the import keeps),
        and ``--rpc`` with the workers. With a pinned file, ``-hf`` becomes ``-m <path>``, as
        sparkrun's launch does once the GGUF is in the cache."""
        python = is_python_server(entrypoint)
        args = tuple(spec.args)
        if self.fetches_at_start(spec):
            args, found = set_in_place(args, HF_FLAGS, spec.model)
            if not found:
                args = ("-hf", spec.model, *without(args, MODEL_FLAGS))
        else:
            path = str(PurePosixPath(ctx.model_ref) / ctx.model_file) if ctx.model_file else ctx.model_ref
            args = _hf_to_model(args)
            args, found = set_in_place(args, MODEL_FLAGS, path)
            if not found:
                args = ("--model", path, *args)
        args = sparkrun_style_args(args, (), ("--host",), ("--port",), ctx, self.default_port)
        workers = [f"{ip}:{ctx.rendezvous_port}" for ip in ctx.peer_fabric_ips[1:]]
        if workers:
            args += ("--rpc_servers" if python else "--rpc", ",".join(workers))
        return (*entrypoint, *args)

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


def _hf_to_model(args: tuple[str, ...]) -> tuple[str, ...]:
    """args with the first ``-hf``/``--hf-repo`` flag spelled ``-m`` and any ``--hf-file`` dropped
    (sparkrun's ``rendered.replace("-hf ", "-m ", 1)`` once the file is resolved)."""
    hf = {normal(f) for f in HF_FLAGS}
    out = without(args, ("-hff", "--hf-file"))
    for i, word in enumerate(out):
        if is_flag(word) and normal(flag_name(word)) in hf:
            value = word.partition("=")[2]
            out[i : i + 1] = ["-m", value] if value else ["-m"]
            break
    return tuple(out)
