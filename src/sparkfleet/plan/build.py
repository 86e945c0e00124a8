"""plan(recipe, cluster, overrides) -> Plan: exactly what ``up`` will do on every node.

Pure: no network, no disk writes, no clock. ``up`` executes the Plan object it is given and
never recomputes it, so what ``sparkfleet plan`` prints is what runs.
"""

from __future__ import annotations

import re
from pathlib import Path

from sparkfleet.config import names
from sparkfleet.config.cluster import Cluster, Node
from sparkfleet.config.placeholders import placeholder_keys
from sparkfleet.config.recipe import Recipe
from sparkfleet.config.secrets import SECRET_VALUE
from sparkfleet.config.templates import node_values, render
from sparkfleet.errors import PlanError
from sparkfleet.nodes.runtime.docker import docker_run_argv
from sparkfleet.plan.engines import RankContext, engine_for
from sparkfleet.plan.model import (
    CONTAINER_HF_HOME,
    EnvOverride,
    EnvSource,
    EnvVar,
    ImageSpec,
    MemorySpec,
    MountSpec,
    Overrides,
    Plan,
    RankPlan,
    ServeSpec,
    VerifySpec,
    container_name,
)
from sparkfleet.plan.secret_args import split_secret_args
from sparkfleet.plan.staging import Planning, StagingStep, hub


def check_plannable(recipe: Recipe, cluster: Cluster | None = None) -> None:
    """Every check plan() makes before it places ranks on nodes; ``validate`` runs it without a
    cluster, so a recipe it accepts is refused by plan only for what the cluster adds."""
    _refuse_placeholders(recipe, cluster)
    problem = engine_for(recipe.engine).check_layout(recipe.launch_spec())
    if problem:
        raise PlanError(f"{recipe.source}: {problem}")
    for entry in recipe.staging:
        problem = entry.problem()
        if problem:
            raise PlanError(f"{recipe.source}: staging {entry.id!r}: {problem}")


def _refuse_placeholders(recipe: Recipe, cluster: Cluster | None) -> None:
    """One message naming every key, in both files, that still holds an importer's placeholder."""
    found = [(recipe.source, placeholder_keys(recipe.model_dump(exclude={"source", "variants"})))]
    if cluster is not None:
        # Resolved nodes: a placeholder under [defaults] shows at every node that inherits it.
        found.append((cluster.source, placeholder_keys({"nodes": [n.model_dump() for n in cluster.nodes]})))
    where = [(source, ", ".join(keys)) for source, keys in found if keys]
    if where:
        (first, keys), rest = where[0], where[1:]
        raise PlanError(
            f"{first}: fill in the <SET ME: …> placeholders that sparkfleet import left: {keys}"
            + "".join(f"; {source}: {more}" for source, more in rest)
        )


def plan(recipe: Recipe, cluster: Cluster, deployment: str, overrides: Overrides | None = None) -> Plan:
    """Plan recipe on the first ``required_nodes`` nodes of cluster as deployment NAME."""
    overrides = overrides or Overrides()
    name = overrides.name or deployment
    try:
        names.deployment(name)
    except ValueError as exc:
        raise PlanError(f"{'--name' if overrides.name else recipe.source}: {exc}") from None
    nnodes = recipe.required_nodes
    check_plannable(recipe, cluster)
    if nnodes > len(cluster.nodes):
        raise PlanError(
            f"{recipe.source}: required_nodes = {nnodes}, but cluster {cluster.name!r} "
            f"({cluster.source}) has {len(cluster.nodes)} node(s)"
        )
    nodes = cluster.nodes[:nnodes]
    adapter = engine_for(recipe.engine)
    port = recipe.port or adapter.default_port
    rdv_port = recipe.rendezvous_port or adapter.default_rendezvous_port
    head = nodes[0]
    ranks = tuple(_rank_plan(recipe, name, r, node, nodes, port, rdv_port, overrides) for r, node in enumerate(nodes))
    endpoint_host = "127.0.0.1" if head.host in ("localhost", "local") else head.host
    return Plan(
        name=name,
        title=recipe.name,
        engine=recipe.engine,
        recipe_source=recipe.source,
        cluster_name=cluster.name,
        cluster_source=cluster.source,
        endpoint=f"http://{endpoint_host}:{port}",
        port=port,
        served_model=adapter.served_model(recipe.launch_spec()),
        launch_order=(*range(1, nnodes), 0),
        ranks=ranks,
        staging=_staging(recipe, Planning(name, nodes, recipe.tensor_parallel_size, recipe.revision)),
        verify=_verify(recipe),
        memory=_memory(recipe),
        image=_image(recipe),
        revision=recipe.revision,
        model_repo=_model_repo(recipe),
        variant=recipe.variant,
        serve=ServeSpec(
            recipe.serve.restart,
            recipe.serve.max_restarts,
            recipe.serve.backoff,
            recipe.serve.mem_floor,
            recipe.serve.gateway_route(),
        ),
        warnings=env_overrides(ranks, {n.name: cluster_env(n, adapter.host_ip_env) for n in nodes}),
        secret_args=secret_arg_notes(recipe),
        not_carried=recipe.not_carried,
    )


def secret_arg_notes(recipe: Recipe) -> tuple[str, ...]:
    """What validate and plan say about credentials in the recipe's args (as written)."""
    _, found = split_secret_args(recipe.engine, recipe.args)
    notes = [a.describe() for a in found]
    for key in ("model", "served_model_name", "model_file", "docker_image"):
        value = getattr(recipe, key, None)
        if isinstance(value, str) and SECRET_VALUE.match(value):
            notes.append(f"{key}: shaped like a token (is it one?): masked in the commands plans and records show")
    return tuple(dict.fromkeys(notes))


def cluster_env(node: Node, host_ip_env: tuple[str, ...]) -> dict[str, str]:
    """The cluster layer of a node's env: the engine's host-IP keys from its fabric address,
    the socket interfaces, HCAs and GID index from its settings, then its ``[nodes.env]``."""
    env: dict[str, str] = {key: node.fabric_ip for key in host_ip_env}
    if node.fabric_ifname:
        env["NCCL_SOCKET_IFNAME"] = node.fabric_ifname
        env["GLOO_SOCKET_IFNAME"] = node.fabric_ifname
    if node.ib_hca:
        env["NCCL_IB_HCA"] = node.ib_hca
    if node.ib_gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(node.ib_gid_index)
    env.update(node.env)
    return env


def env_overrides(ranks: tuple[RankPlan, ...], per_node: dict[str, dict[str, str]]) -> tuple[EnvOverride, ...]:
    """Where a recipe or --env value replaced a cluster value that the cluster sets per node
    (differently between nodes): one value for all nodes hides a node whose NIC is named
    otherwise (the seed's NCCL_SOCKET_IFNAME on a node with enp1s0f1np1)."""
    found: list[EnvOverride] = []
    for rank in ranks:
        mine = per_node[rank.node.name]
        for var in rank.env:
            if var.source not in ("recipe", "cli") or var.key not in mine or mine[var.key] == var.value:
                continue
            values = {name: env.get(var.key) for name, env in per_node.items()}
            if len(set(values.values())) > 1:
                found.append(EnvOverride(rank.node.name, var.key, var.value, var.source, mine[var.key],
                                         tuple((n, v) for n, v in values.items() if v is not None)))  # fmt: skip
    return tuple(found)


_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def _model_repo(recipe: Recipe) -> str | None:
    """The Hugging Face repo whose snapshot the ranks serve (a composed model's first source),
    or None when the model is a path."""
    if recipe.composed_model is not None:
        return recipe.composed_model.sources[0].repo
    if engine_for(recipe.engine).fetches_at_start(recipe.launch_spec()):
        return None  # not from the node's cache: the engine downloads it as it starts
    return recipe.model if _REPO_ID.match(recipe.model) else None


def _verify(recipe: Recipe) -> VerifySpec:
    v = recipe.verify
    return VerifySpec(
        expect=v.expect,
        forbid=v.forbid,
        smoke_prompt=v.smoke_prompt,
        smoke_expect=v.smoke_expect,
        smoke_max_tokens=v.smoke_max_tokens,
        timeout=v.timeout,
        fabric_min_gbps=v.fabric_min_gbps,
    )


def _memory(recipe: Recipe) -> MemorySpec:
    mem = recipe.memory
    coefficient = mem.prefill_bytes_per_token2
    if coefficient is None:
        coefficient = engine_for(recipe.engine).prefill_bytes_per_token2(recipe.model, recipe.parent_model)
    return MemorySpec(
        engine=recipe.engine,
        tp=recipe.tensor_parallel_size,
        nnodes=recipe.required_nodes,
        kv_bytes_per_token=mem.kv_bytes_per_token,
        weights_per_rank=mem.weights_per_rank,
        weights_exclude=mem.weights_exclude,
        cuda_graph=mem.cuda_graph,
        prefill_bytes_per_token2=coefficient,
        head_overhead=mem.head_overhead,
        device_memory=mem.device_memory,
    )


def build_context_candidates(recipe_source: str, image_dir: str) -> tuple[Path, ...]:
    """Where the build context ``docker_image_dir`` names may be, in order: the path itself when
    absolute; else beside the recipe, in a ``docker-images/`` folder beside it or above it, or
    in the working directory."""
    given = Path(image_dir).expanduser()
    if given.is_absolute():
        return (given,)
    base = Path(recipe_source).resolve()
    base = base.parent if base.is_file() or base.suffix == ".toml" else base
    return (base / given, *(p / "docker-images" / given for p in (base, *base.parents)), Path.cwd() / given)


def _image(recipe: Recipe) -> ImageSpec | None:
    if recipe.docker_image is None:
        return None
    if not recipe.docker_image_dir:
        return ImageSpec(recipe.docker_image)
    candidates = build_context_candidates(recipe.source, recipe.docker_image_dir)
    found = next((p for p in candidates if p.is_dir()), None)
    return ImageSpec(
        ref=recipe.docker_image,
        build_dir=recipe.docker_image_dir,
        context=str(found) if found is not None else None,
        looked_in=tuple(str(p) for p in candidates),
    )


def container_hf_home(recipe: Recipe) -> str:
    """Where a container sees the node's Hugging Face cache: the recipe's ``hf_mount`` or the
    engines' usual path."""
    return recipe.hf_mount or CONTAINER_HF_HOME


def _model_ref_and_mounts(recipe: Recipe, node: Node, deployment: str, docker: bool) -> tuple[str, list[MountSpec]]:
    mounts: list[MountSpec] = []
    if recipe.composed_model is not None:
        # The composer links `<dir>/model` to the first source's snapshot folder inside it.
        host_dir = recipe.composed_model.dir_on(node, deployment) + "/model"
        if not docker:
            return host_dir, mounts
        mounts.append(MountSpec(host_dir, recipe.composed_model.mount, True))
        # The composed files are symlinks into the node's cache: mount it at the same path.
        mounts.append(MountSpec(node.hf_cache, node.hf_cache, True))
        return recipe.composed_model.mount, mounts
    if recipe.model.startswith("/"):
        if docker:
            if recipe.hf_mount:
                # Asked for by name (sparkrun mounts the cache in every container): there too.
                mounts.append(MountSpec(node.hf_cache, recipe.hf_mount, True))
            if not (recipe.hf_mount and recipe.model.startswith(recipe.hf_mount + "/")):
                mounts.append(MountSpec(recipe.model, recipe.model, True))  # else: inside that mount
        return recipe.model, mounts
    if docker:
        # Writable where the engine downloads the model into it at start (llama.cpp's -hf).
        fetches = engine_for(recipe.engine).fetches_at_start(recipe.launch_spec())
        mounts.append(MountSpec(node.hf_cache, container_hf_home(recipe), not fetches))
    root = container_hf_home(recipe) if docker else node.hf_cache
    return engine_for(recipe.engine).hub_model_ref(recipe.model, recipe.revision, root), mounts


def _staging_mounts(recipe: Recipe, deployment: str, node: Node, nodes: tuple[Node, ...],
                    mounts: list[MountSpec]) -> list[MountSpec]:  # fmt: skip
    """What the staging entries mount read-only into the node's containers (an ``nfs`` share),
    each in place of any other mount at its path."""
    at = Planning(deployment, nodes)
    for entry in recipe.staging:
        found = entry.mount(at, node)
        if found is not None:
            mounts = [m for m in mounts if m.container != found[1]] + [MountSpec(found[0], found[1], True)]
    return mounts


def _env(
    recipe: Recipe,
    node: Node,
    rank: int,
    deployment: str,
    docker: bool,
    overrides: Overrides,
    from_args: dict[str, str] | None = None,
) -> tuple[EnvVar, ...]:
    adapter = engine_for(recipe.engine)
    values = node_values(node, rank, deployment)
    layers: list[tuple[EnvSource, dict[str, str]]] = []
    engine_env = {"HF_HUB_OFFLINE": "1", "HF_HOME": container_hf_home(recipe) if docker else node.hf_cache}
    if adapter.fetches_at_start(recipe.launch_spec()):
        del engine_env["HF_HUB_OFFLINE"]  # the engine downloads the model itself as it starts
    layers.append(("engine", engine_env))
    layers.append(("cluster", cluster_env(node, adapter.host_ip_env)))
    # Secrets taken out of the recipe's args: under the recipe's own env, which may name them.
    layers.append(("recipe", {**(from_args or {}), **{k: render(v, values) for k, v in recipe.env.items()}}))
    layers.append(("cli", dict(overrides.env)))
    merged: dict[str, EnvVar] = {}
    for source, env in layers:
        for key, value in env.items():
            merged[key] = EnvVar(key, value, source)
    return tuple(merged[k] for k in sorted(merged))


def _rank_plan(
    recipe: Recipe,
    deployment: str,
    rank: int,
    node: Node,
    nodes: tuple[Node, ...],
    port: int,
    rdv_port: int,
    overrides: Overrides,
) -> RankPlan:
    adapter = engine_for(recipe.engine)
    docker = recipe.docker_image is not None
    values = node_values(node, rank, deployment)
    model_ref, mounts = _model_ref_and_mounts(recipe, node, deployment, docker)
    entrypoint = tuple(render(w, values) for w in (recipe.entrypoint or adapter.default_entrypoint))
    ctx = RankContext(
        rank=rank,
        nnodes=len(nodes),
        fabric_ip=node.fabric_ip,
        head_fabric_ip=nodes[0].fabric_ip,
        peer_fabric_ips=tuple(n.fabric_ip for n in nodes),
        port=port,
        rendezvous_port=rdv_port,
        model_ref=model_ref,
        model_file=recipe.model_file,
        entrypoint=entrypoint,
        bind_ip=node.bind_address,
    )
    args, secret_args = split_secret_args(recipe.engine, tuple(render(a, values) for a in recipe.args))
    launch = recipe.launch_spec(args)
    argv = adapter.rank_argv(launch, entrypoint, ctx)
    for m in recipe.extra_mounts:
        mounts.append(MountSpec(render(m.host, values), render(m.container, values), m.read_only))
    if docker:
        mounts = _staging_mounts(recipe, deployment, node, nodes, mounts)
    workdir = f"{node.state_dir}/deployments/{deployment}"
    name = container_name(deployment, rank)
    env = _env(recipe, node, rank, deployment, docker, overrides, {var: a.value for a in secret_args for var in a.env})
    env_file = f"{workdir}/r{rank}.env"
    container_argv = (
        docker_run_argv(
            recipe.docker_image, recipe.shm_size, node, deployment, rank, name, env_file, tuple(mounts), argv
        )
        if recipe.docker_image
        else None
    )
    readiness = adapter.readiness(ctx)
    shaped = _token_shaped((*argv, *(container_argv or ())))
    ports = (port, rdv_port) if rank == 0 else ((rdv_port,) if readiness.tcp_port else ())
    return RankPlan(
        rank=rank,
        node=node,
        runtime="docker" if docker else "process",
        image=recipe.docker_image,
        argv=argv,
        env=env,
        mounts=tuple(mounts),
        container_name=name,
        container_argv=container_argv,
        workdir=workdir,
        env_file=env_file,
        log_path=f"{workdir}/r{rank}.log",
        pid_path=f"{workdir}/r{rank}.pid",
        readiness=readiness,
        ports=ports,
        stop_wave=next(i for i, wave in enumerate(adapter.stop_waves(len(nodes))) if rank in wave),
        secret_words=tuple(dict.fromkeys([*(a.value for a in secret_args if not a.env), *shaped])),
    )


def _token_shaped(words: tuple[str, ...]) -> list[str]:
    """Words of a rank's command shaped like a token wherever they came from (a model or served
    name, an entrypoint): masked like a token found in args."""
    return [part for word in words for part in (word, word.partition("=")[2]) if SECRET_VALUE.match(part)]


def _staging(recipe: Recipe, at: Planning) -> tuple[StagingStep, ...]:
    """The Hub fetch (onto a sync's source node) first, then every entry's steps in recipe order,
    then the composed model's."""
    names = [n.name for n in at.nodes]
    for entry in recipe.staging:
        for key, named in entry.named_nodes().items():
            if named not in names:
                raise PlanError(f"{recipe.source}: staging {entry.id!r}: {key} = {named!r} is not one of the "
                                f"planned nodes ({', '.join(names)})")  # fmt: skip
    steps: list[StagingStep] = []
    adapter = engine_for(recipe.engine)
    if (
        recipe.composed_model is None
        and _REPO_ID.match(recipe.model)
        and not adapter.fetches_at_start(recipe.launch_spec())
    ):
        profile = adapter.hub_profile(recipe.launch_spec())
        steps += hub.steps(recipe.model, profile, recipe.staging, at)
    for entry in recipe.staging:
        steps += entry.steps(at)
    if recipe.composed_model is not None:
        steps += recipe.composed_model.steps(at)
    return tuple(steps)
