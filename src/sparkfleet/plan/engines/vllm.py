"""vLLM: the ``mp`` backend runs ``vllm serve`` on every node (``--headless`` above rank 0);
the ``ray`` backend joins every node to a Ray cluster and serves from the head."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import PurePosixPath

from sparkfleet.plan.engines.base import (
    AdapterDefaults,
    LaunchSpec,
    MemoryRules,
    RankContext,
    Readiness,
    conflicting_flag,
    gpu_ranks_cover_nodes,
    reserved_flags,
    revision_flags,
    sparkrun_style_args,
)
from sparkfleet.plan.flags import flag_value, has_flag

TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")
# The flags a sparkrun-style recipe keeps in args (values replaced per rank, sparkrun_style_args).
SPARKRUN_STYLE_OWN = (*TP_FLAGS, *PP_FLAGS, "--host", "--port")
RESERVED = (
    "--model",
    "--nnodes",
    "-n",
    "--node-rank",
    "-r",
    "--master-addr",
    "--master-port",
    "--headless",
    *SPARKRUN_STYLE_OWN,
)
RAY_PORT_OFFSET = 0
VLLM_GRAPH_DEFAULT = 2 * 1024**3
EXECUTOR = "--distributed-executor-backend"


class VLLM(AdapterDefaults):
    """``vllm serve`` per rank (mp) or on the Ray head (ray)."""

    name = "vllm"
    default_port = 8000
    default_rendezvous_port = 29501
    default_entrypoint: tuple[str, ...] = ("vllm", "serve")
    host_ip_env: tuple[str, ...] = ("VLLM_HOST_IP",)
    memory: MemoryRules | None = MemoryRules(
        fraction_flag="--gpu-memory-utilization",
        fraction_default=0.9,
        chunk_flag="--max-num-batched-tokens",
        chunk_default=8192,
        context_flag="--max-model-len",
        kv_bytes_flag="--kv-cache-memory-bytes",
    )
    # vLLM aborts a request whose client disconnected.
    aborts_on_disconnect = True

    def check_recipe(self, spec: LaunchSpec) -> str | None:
        problem = conflicting_flag(spec.args, reserved_flags(spec, RESERVED, SPARKRUN_STYLE_OWN), self.name)
        if problem:
            return problem
        ray = spec.distributed_backend == "ray"
        if ray and has_flag(spec.args, EXECUTOR) and flag_value(spec.args, EXECUTOR) != "ray":
            return 'args: --distributed-executor-backend contradicts distributed_backend = "ray"'
        return None

    def _serve(self, spec: LaunchSpec, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        if spec.command_style == "sparkrun":
            # The recipe's own -tp/-pp/--host/--port, values this plan's; nothing added for them.
            args = sparkrun_style_args(
                spec.args, ((TP_FLAGS, spec.tensor_parallel_size), (PP_FLAGS, spec.pipeline_parallel_size)),
                ("--host",), ("--port",), ctx, self.default_port,
            )  # fmt: skip
            return (*entrypoint, ctx.model_ref, *revision_flags(spec, ctx.model_ref), *args)
        return (
            *entrypoint,
            ctx.model_ref,
            *revision_flags(spec, ctx.model_ref),
            *spec.args,
            "--tensor-parallel-size", str(spec.tensor_parallel_size),
            "--pipeline-parallel-size", str(spec.pipeline_parallel_size),
        )  # fmt: skip

    def check_layout(self, spec: LaunchSpec) -> str | None:
        return gpu_ranks_cover_nodes(spec)

    def rank_argv(self, spec: LaunchSpec, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        if spec.distributed_backend == "ray" and ctx.nnodes > 1:
            return self._ray_argv(spec, entrypoint, ctx)
        argv = self._serve(spec, entrypoint, ctx)
        if ctx.nnodes > 1:
            argv += (
                "--nnodes", str(ctx.nnodes),
                "--node-rank", str(ctx.rank),
                "--master-addr", ctx.head_fabric_ip,
                "--master-port", str(ctx.rendezvous_port),
            )  # fmt: skip
        if ctx.rank > 0:
            # A sparkrun-style rank keeps the recipe's --host/--port here too, as sparkrun does.
            return (*argv, "--headless")
        if spec.command_style == "sparkrun":
            return argv
        return (*argv, "--host", ctx.bind_ip, "--port", str(ctx.port))

    def _ray_argv(self, spec: LaunchSpec, entrypoint: tuple[str, ...], ctx: RankContext) -> tuple[str, ...]:
        address = f"{ctx.head_fabric_ip}:{ctx.rendezvous_port}"
        ray, python = _ray_tools(entrypoint)
        if ctx.rank > 0:
            # Workers may start before the head; keep trying to join until it answers.
            join = (
                f"until {ray} start --block --address={shlex.quote(address)} "
                f"--node-ip-address={shlex.quote(ctx.fabric_ip)}; do sleep 2; done"
            )
            return ("bash", "-c", join)
        serve = self._serve(spec, entrypoint, ctx)
        if not has_flag(spec.args, EXECUTOR):
            serve += (EXECUTOR, "ray")
        if spec.command_style == "sparkfleet":
            serve += ("--host", ctx.bind_ip, "--port", str(ctx.port))
        wait_nodes = (
            "import ray,sys; ray.init(address='auto', logging_level='ERROR'); "
            f"sys.exit(0 if sum(n['Alive'] for n in ray.nodes()) >= {ctx.nnodes} else 1)"
        )
        script = (
            f"{ray} start --head --port={ctx.rendezvous_port} --node-ip-address={shlex.quote(ctx.fabric_ip)}"
            f" && until {python} -c {shlex.quote(wait_nodes)}; do sleep 2; done"
            f" && exec {shlex.join(serve)}"
        )
        return ("bash", "-c", script)

    def readiness(self, ctx: RankContext) -> Readiness:
        if ctx.rank == 0:
            return Readiness(True, "/health", r"Application startup complete")
        return Readiness(False, None, None)

    def cuda_graphs(self, argv: Sequence[str]) -> tuple[int, str]:
        if has_flag(argv, "--enforce-eager"):
            return 0, "--enforce-eager: no graphs"
        return VLLM_GRAPH_DEFAULT, "estimate: vLLM graph pool"


def _ray_tools(entrypoint: tuple[str, ...]) -> tuple[str, str]:
    """The ``ray`` and ``python3`` of the environment vLLM runs from: beside an entrypoint given
    as a path (a venv's bin/vllm or bin/python), else the names as the node's PATH finds them
    (an image). A login shell's PATH on the node may put another python first (pyenv shims),
    one without ray."""
    first = entrypoint[0] if entrypoint else ""
    if "/" not in first:
        return "ray", "python3"
    bin_dir = PurePosixPath(first).parent
    python = first if PurePosixPath(first).name.startswith("python") else str(bin_dir / "python3")
    return shlex.quote(str(bin_dir / "ray")), shlex.quote(python)
