"""Run by scripts/sparkrun-agreement.py under sparkrun's own Python (a separate venv with
sparkrun's source on PYTHONPATH): for each recipe file named on stdin (one path a line), ask
sparkrun's own code what it would run, with a stand-in cluster of site values, and print one
JSON object a line.

Nothing here decides a flag or an env value: the recipe is loaded by ``Recipe.load``, the hosts
are placed by ``api._hosts.resolve_effective_hosts``, the serve command comes from
``runtime.generate_command``, and ``runtime.run(dry_run=True)`` launches it with an executor
whose script generators are wrapped to record what they were given (image, volumes, env, serve
command per container), exactly as sparkrun's launcher calls them (as `sparkrun run --trust`:
recipe hooks allowed; per-host backends for default DGX Spark hardware). Dry runs make no SSH calls;
InfiniBand detection is answered by an empty stand-in (no fabric: the site's NCCL values are not
what is compared).

Output per recipe: {"file", "ok", "error", "runtime", "hosts", "solo", "containers": [{"host",
"name", "image", "volumes", "env", "serve": [...commands exec'd in it]}]}.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback

HOSTS = [f"10.99.0.{i}" for i in range(1, 9)]  # the stand-in cluster: eight one-GPU nodes
HF_CACHE = "/site/hf-cache"  # the stand-in host HF cache


def main() -> None:
    home = tempfile.mkdtemp(prefix="sparkrun-home-")
    os.environ["HOME"] = home  # no user config, registries or job files of this machine
    os.environ.setdefault("SPARKRUN_NO_TELEMETRY", "1")
    if os.environ.get("SPARKRUN_RENDER_VERSION", "").startswith("0.3"):
        os.environ.setdefault("SPARKRUN_NO_RUNTIME_CACHE", "1")  # 0.3 has no runtime cache
    import logging
    import time

    logging.disable(logging.CRITICAL)
    # A dry run still waits where a launch would (settle and poll delays); what it renders does
    # not depend on them.
    time.sleep = lambda *_a, **_k: None
    from sparkrun.core.bootstrap import get_runtime, init_sparkrun

    v = init_sparkrun(log_level="CRITICAL")
    import sparkrun.api as api

    def idle(*_a, **_k):
        raise RuntimeError("stand-in cluster: no occupancy snapshot")

    # Placement asks the hosts (over SSH) what already runs there; the stand-in cluster is idle,
    # which sparkrun's scheduler handles as "no occupancy info" (greedy packing).
    api.status = idle
    for line in sys.stdin:
        path = line.strip()
        if not path:
            continue
        try:
            out = render(path, v, get_runtime)
        except (Exception, SystemExit) as exc:  # sparkrun refusing a recipe is a result, reported by name
            last = traceback.extract_tb(exc.__traceback__)[-1:]
            where = f" ({last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
            out = {"file": path, "ok": False, "error": f"{type(exc).__name__}: {exc}{where}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


def render(path: str, v, get_runtime) -> dict:
    from sparkrun.core.config import SparkrunConfig
    from sparkrun.core.launcher import resolve_per_host_backends
    from sparkrun.core.recipe import Recipe
    from sparkrun.orchestration.comm_env import ClusterCommEnv
    from sparkrun.orchestration.executor import resolve_executor

    recipe = Recipe.load(path)
    runtime = get_runtime(recipe.runtime, v)
    hosts, solo, placement = _place(recipe, runtime)
    config = SparkrunConfig()
    executor = resolve_executor(recipe=recipe, runtime=runtime, config=config, v=v)
    # One entry per container started (Ray workers share one name across hosts, so a list).
    containers: list[dict] = []

    def launch(orig):
        def wrapped(image, container_name, command, env=None, volumes=None, nccl_env=None, *a, **kw):
            c = {"name": container_name, "serve": []}
            containers.append(c)
            c.update(image=image, volumes=dict(volumes or {}), env={**(nccl_env or {}), **(env or {})},
                     command=command)  # fmt: skip
            return orig(image, container_name, command, env, volumes, nccl_env, *a, **kw)

        return wrapped

    def exec_serve(orig):
        def wrapped(container_name, serve_command, env=None, *a, **kw):
            c = _entry(containers, container_name)
            c["serve"].append({"command": serve_command, "env": dict(env or {})})
            return orig(container_name, serve_command, env, *a, **kw)

        return wrapped

    executor.generate_launch_script = launch(executor.generate_launch_script)
    executor.generate_exec_serve_script = exec_serve(executor.generate_exec_serve_script)
    for name in ("generate_ray_head_script", "generate_ray_worker_script", "generate_node_script"):
        if hasattr(executor, name):
            setattr(executor, name, _record(containers, name, getattr(executor, name)))
    overrides: dict = {}
    serve_command = runtime.generate_command(
        recipe=recipe, overrides=overrides, is_cluster=not solo, num_nodes=len(hosts), head_ip=None
    )
    comm = ClusterCommEnv(shared={}, per_host={})
    import inspect

    run_params = inspect.signature(runtime.run).parameters
    if "overrides" in inspect.signature(runtime.resolve_container).parameters:  # before 0.4
        image = runtime.resolve_container(recipe, overrides)
    else:
        image = runtime.resolve_container(recipe)
    extra: dict = {}
    if "platform_env_by_host" in run_params:
        # 0.4: what launcher.launch_inference adds before runtime.run (the runtime cache at
        # /cache/runtime and the platform's env defaults per host), from sparkrun's own helpers.
        from sparkrun.core.hardware import resolve_host_hardware
        from sparkrun.core.launcher import resolve_launch_runtime_cache, resolve_platform_env_by_host

        hardware = resolve_host_hardware(hosts, None, placement)
        extra["runtime_cache"] = resolve_launch_runtime_cache(
            runtime=runtime, recipe=recipe, overrides=overrides, config=config, cluster=None, host_list=hosts,
            ssh_kwargs={}, image=image, probe_image=False, dry_run=True,
        )  # fmt: skip
        extra["platform_env_by_host"] = resolve_platform_env_by_host(runtime, hardware, dict(recipe.env or {}))
        extra["placement"] = placement
        backends = resolve_per_host_backends(hosts, host_hardware=hardware, placement=placement) or None
    else:
        backends = resolve_per_host_backends(hosts) or None
    rc = runtime.run(
        hosts=hosts, image=image, serve_command=serve_command,
        recipe=recipe, overrides=overrides, cluster_id="sparkrun_standin", env=recipe.env,
        cache_dir=HF_CACHE, config=config, dry_run=True, detached=True, comm_env=comm,
        ib_ip_map={}, executor=executor, follow=False, trust=True, backends=backends, **extra,
    )  # fmt: skip
    return {
        "file": path,
        "ok": rc == 0,
        "error": None if rc == 0 else f"runtime.run returned {rc}",
        "runtime": recipe.runtime,
        "hosts": hosts,
        "solo": solo,
        "serve_command": serve_command,
        "containers": containers,
    }


def _entry(containers: list[dict], name: str) -> dict:
    """The first container started under that name (a serve command runs in the head's)."""
    for c in containers:
        if c["name"] == name:
            return c
    c = {"name": name, "serve": []}
    containers.append(c)
    return c


def _record(containers: list[dict], kind: str, orig):
    def wrapped(*a, **kw):
        names = [x for x in a if isinstance(x, str) and x.startswith("sparkrun_")] or [kw.get("container_name", kind)]
        c = {"name": names[0], "serve": []}
        containers.append(c)
        kept = {k: x for k, x in kw.items() if isinstance(x, str | dict)}
        c.setdefault("scripts", []).append({"kind": kind, "args": [x for x in a if isinstance(x, str | dict)],
                                            "kwargs": kept})  # fmt: skip
        return orig(*a, **kw)

    return wrapped


def _place(recipe, runtime) -> tuple[list[str], bool, object]:
    """sparkrun's own placement of the recipe on the stand-in cluster (no occupancy: dry run)."""
    from sparkrun.api import _hosts

    chain = recipe.build_config_chain({})
    given = list(HOSTS)
    if not any(chain.get(k) is not None for k in ("tensor_parallel", "pipeline_parallel", "data_parallel",
                                                   "expert_parallel", "context_parallel")):  # fmt: skip
        # Without parallelism in its defaults a recipe runs on every host it is given (sparkrun
        # trims only by tp x pp x dp and max_nodes): the cluster's size is the site's choice, so
        # the stand-in gives it the recipe's own minimum.
        given = given[: max(int(getattr(recipe, "min_nodes", 1) or 1), 1)]
    got = _hosts.resolve_effective_hosts(given, recipe, {}, runtime=runtime)
    return list(got[0]), bool(got[1]), (got[3] if len(got) > 3 else None)


if __name__ == "__main__":
    main()
