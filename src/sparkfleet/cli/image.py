"""``sparkfleet image build|push RECIPE``: the recipe's image, with the same ID on every node."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from sparkfleet.cli.app import group
from sparkfleet.cli.console import console, err_console
from sparkfleet.cli.options import AcceptNewOpt, ClusterOpt, RecipeArg, SetOpt

if TYPE_CHECKING:
    from sparkfleet.apply.images import ImageAction
    from sparkfleet.nodes.transport.base import Transport
    from sparkfleet.plan.build import Plan

image_app = group("Build the recipe's image and give every node the same image ID.")
COMMANDS = {"image": image_app}

_STYLE = {"skipped": "dim", "built": "green", "loaded": "green", "pulled": "green", "failed": "bold red"}


def _progress(node: str, message: str) -> None:
    err_console.print(f"[dim]{escape(node)}: {escape(message)}[/]")


def _show(actions: list[ImageAction], ref: str) -> None:
    for a in actions:
        iid = a.image_id[7:19] if a.image_id else "-"
        console.print(
            f"[{_STYLE[a.action]}]{a.action:<8}[/] {escape(a.node):<10} {iid:<12} {escape(a.detail)}",
            highlight=False,
        )
    if any(not a.ok for a in actions):
        # SystemExit, not typer.Exit: main() runs click with standalone_mode=False.
        raise SystemExit(1)
    console.print(f"{ref}: same image ID on {len(actions)} node(s)")


def _setup(
    recipe: Path, cluster: Path | None, set_: list[str] | None, accept_new: bool
) -> tuple[Plan, str, dict[str, Transport]]:
    # Imported per command so `sparkfleet --help` stays fast.
    from sparkfleet.apply.images import plan_image
    from sparkfleet.cli.options import build_plan
    from sparkfleet.nodes.transport import transport_for

    planned = build_plan(recipe, cluster, set_, None, None)
    ref = plan_image(planned).ref  # a recipe without an image is refused before any node is reached
    transports = {r.node.name: transport_for(r.node, accept_new_host_keys=accept_new) for r in planned.ranks}
    return planned, ref, transports


@image_app.command("build")
def build_cmd(
    recipe: RecipeArg,
    cluster: ClusterOpt = None,
    set_: SetOpt = None,
    on_each_node: Annotated[
        bool, typer.Option("--on-each-node", help="Build on every node instead of building once and streaming.")
    ] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every layer.")] = False,
    dockerfile: Annotated[str, typer.Option("--file", "-f", help="Dockerfile inside docker_image_dir.")] = "Dockerfile",
    accept_new: AcceptNewOpt = False,
) -> None:
    """Build from docker_image_dir (context shipped over SSH) and stream to nodes that differ."""
    from sparkfleet.apply.images import build_recipe_image

    planned, ref, transports = _setup(recipe, cluster, set_, accept_new)
    _show(build_recipe_image(planned, transports, dockerfile=dockerfile, on_each_node=on_each_node, no_cache=no_cache,
                             progress=_progress), ref)  # fmt: skip


@image_app.command("push")
def push_cmd(
    recipe: RecipeArg,
    cluster: ClusterOpt = None,
    set_: SetOpt = None,
    source: Annotated[str | None, typer.Option("--from", help="Node that holds the image (default: the head).")] = None,
    accept_new: AcceptNewOpt = False,
) -> None:
    """Stream the image from the head (or --from NODE) to every node whose image ID differs."""
    from sparkfleet.apply.images import push_recipe_image

    planned, ref, transports = _setup(recipe, cluster, set_, accept_new)
    _show(push_recipe_image(planned, transports, source, progress=_progress), ref)
