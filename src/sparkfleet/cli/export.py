"""``export k8s`` and ``export slurm``: hand a recipe to Kubernetes (LeaderWorkerSet) or Slurm;
``export systemd``: a unit that watches a running deployment across reboots."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sparkfleet.cli.app import group
from sparkfleet.cli.console import err_console
from sparkfleet.cli.options import NameOpt, RecipeArg, SetOpt
from sparkfleet.errors import UsageError

if TYPE_CHECKING:
    from sparkfleet.config.cluster import Node

export_app = group("Write a recipe as a Kubernetes manifest or an sbatch script.")
COMMANDS = {"export": export_app}

OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Write here (default: stdout).")]
NicsOpt = Annotated[
    Path | None,
    typer.Option("--cluster", "-c", help="Give every rank the NIC settings of this cluster's first node."),
]
GpusOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-node",
        help="GPUs each rank asks for (default: the --cluster node's gpus, else the recipe's TP×PP per node; "
        "llama.cpp only when it offloads layers).",
    ),
]
StateOpt = Annotated[
    str | None,
    typer.Option("--state-dir", help="Where `sparkfleet stage` wrote (default: the --cluster state_dir)."),
]


def _like(cluster: Path | None) -> Node | None:
    """The cluster's first node, whose NIC settings every exported rank gets (or None)."""
    from sparkfleet.config.cluster import load_cluster

    return load_cluster(cluster).nodes[0] if cluster is not None else None


def _emit(text: str, out: Path | None, executable: bool = False) -> None:
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        if executable:
            out.chmod(0o755)
    except OSError as exc:
        raise UsageError(f"{out}: cannot write: {exc.strerror}") from None
    err_console.print(f"[green]wrote[/] {out}")


@export_app.command("k8s")
def k8s(
    recipe: RecipeArg,
    out: OutOpt = None,
    set_: SetOpt = None,
    name: NameOpt = None,
    image: Annotated[str | None, typer.Option("--image", help="Image for a recipe without docker_image.")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", "-n")] = None,
    gpus: GpusOpt = None,
    state_dir: StateOpt = None,
    hf_cache: Annotated[str, typer.Option(help="Hugging Face cache on the nodes.")] = "/root/.cache/huggingface",
    no_rdma: Annotated[bool, typer.Option("--no-rdma", help="Do not mount /dev/infiniband.")] = False,
    cluster: NicsOpt = None,
) -> None:
    """A LeaderWorkerSet (size = required_nodes) and a leader Service, as YAML."""
    # PyYAML is imported only here, to keep `sparkfleet` start-up fast.
    from sparkfleet.config.recipe import deployment_name, load_recipe
    from sparkfleet.exporters.k8s_lws import K8sOptions, k8s_yaml
    from sparkfleet.exporters.rank_templates import gpus_per_node

    loaded = load_recipe(recipe, tuple(set_ or ()))
    like = _like(cluster)
    count = gpus if gpus is not None else gpus_per_node(like, loaded)
    opts = K8sOptions(image=image, namespace=namespace, gpus_per_node=count, hf_cache=hf_cache, rdma=not no_rdma,
                      state_dir=state_dir)  # fmt: skip
    _emit(k8s_yaml(loaded, name or deployment_name(recipe), opts, like), out)


@export_app.command("slurm")
def slurm(
    recipe: RecipeArg,
    out: OutOpt = None,
    set_: SetOpt = None,
    name: NameOpt = None,
    container: Annotated[str, typer.Option(help="docker or pyxis (recipes with an image).")] = "docker",
    gpus: GpusOpt = None,
    state_dir: StateOpt = None,
    partition: Annotated[str | None, typer.Option("--partition", "-p")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="sbatch --time.")] = None,
    exclusive: Annotated[bool, typer.Option("--exclusive", help="sbatch --exclusive.")] = False,
    cluster: NicsOpt = None,
) -> None:
    """An sbatch script: one rank per node with srun, then a wait until rank 0 is healthy."""
    from sparkfleet.config.recipe import deployment_name, load_recipe
    from sparkfleet.exporters.slurm import SlurmOptions, slurm_script

    if container not in ("docker", "pyxis"):
        raise UsageError(f"--container {container!r}: expected docker or pyxis")
    loaded = load_recipe(recipe, tuple(set_ or ()))
    opts = SlurmOptions(
        container=container,  # type: ignore[arg-type]
        gpus_per_node=gpus,
        state_dir=state_dir,
        partition=partition,
        time_limit=time_limit,
        exclusive=exclusive,
    )
    _emit(slurm_script(loaded, name or deployment_name(recipe), opts, _like(cluster)), out, executable=True)


@export_app.command("systemd")
def systemd(
    name: Annotated[str, typer.Argument(help="Deployment name (one this controller brought up), or `gateway`.")],
    out: OutOpt = None,
    interval: Annotated[float, typer.Option(help="watch --interval of the service.")] = 10.0,
    user_unit: Annotated[bool, typer.Option("--user-unit", help="A unit for systemctl --user.")] = False,
    config: Annotated[Path | None, typer.Option("--config", help="gateway: its gateway.toml.")] = None,
) -> None:
    """A systemd unit that runs `sparkfleet watch NAME` (and its restart policy) across reboots;
    `export systemd gateway` one that runs `sparkfleet gateway serve`."""
    import getpass

    from sparkfleet.exporters.systemd import UnitOptions, gateway_unit, systemd_unit
    from sparkfleet.state.deployments import Deployments
    from sparkfleet.state.store import state_dir

    opts = UnitOptions(state_dir=str(state_dir().resolve()), interval=interval, user=getpass.getuser(),
                       user_unit=user_unit)  # fmt: skip
    if name == "gateway":
        if config is not None:
            from sparkfleet.gateway.config import load

            load(config)  # a mistake in it is said now, not by a unit that will not start
        _emit(gateway_unit(opts, str(config.resolve()) if config else None), out)
        return
    if config is not None:
        raise UsageError("--config is the gateway's: `sparkfleet export systemd gateway --config gateway.toml`")
    Deployments().require(name, f"none is recorded in {state_dir()}: bring it up first")
    _emit(systemd_unit(name, opts), out)
