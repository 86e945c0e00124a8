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

EachOpt = Annotated[
    bool, typer.Option("--on-each-node", help="Build on every node instead of building once and streaming.")
]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Rebuild every layer.")]
FileOpt = Annotated[str, typer.Option("--file", "-f", help="Dockerfile inside docker_image_dir.")]
FromOpt = Annotated[str | None, typer.Option("--from", help="Node that holds the image (default: the head).")]
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
    from sparkfleet.cli.options import build_plan
    from sparkfleet.errors import RecipeError
    from sparkfleet.nodes.transport import transport_for

    planned = build_plan(recipe, cluster, set_, None, None)
    if planned.image is None:
        raise RecipeError(f"{planned.recipe_source}: no docker_image: this recipe runs host processes")
    transports = {r.node.name: transport_for(r.node, accept_new_host_keys=accept_new) for r in planned.ranks}
    return planned, planned.image.ref, transports


def build_cmd(
    recipe: RecipeArg,
    cluster: ClusterOpt = None,
    set_: SetOpt = None,
    on_each_node: EachOpt = False,
    no_cache: NoCacheOpt = False,
    dockerfile: FileOpt = "Dockerfile",
    accept_new: AcceptNewOpt = False,
) -> None:
    """Build from docker_image_dir (context shipped over SSH) and stream to nodes that differ."""
    from sparkfleet.apply.images import build
    from sparkfleet.errors import RecipeError

    planned, ref, transports = _setup(recipe, cluster, set_, accept_new)
    image, source = planned.image, planned.recipe_source
    assert image is not None  # _setup refused a recipe without an image
    if not image.build_dir:
        raise RecipeError(f"{source}: no docker_image_dir to build {ref} from (use `image push`)")
    if image.context is None:
        raise RecipeError(
            f"{source}: docker_image_dir = {image.build_dir!r}: no such folder (looked in {image.looked_in[0]})"
        )
    context = Path(image.context)
    if not (context / dockerfile).is_file():
        raise RecipeError(f"{source}: docker_image_dir {context} has no {dockerfile}")
    head = planned.ranks[0].node.name
    actions = build(ref, context, transports, head, dockerfile=dockerfile, on_each_node=on_each_node,
                    no_cache=no_cache, progress=_progress)  # fmt: skip
    _show(actions, ref)


def push_cmd(
    recipe: RecipeArg,
    cluster: ClusterOpt = None,
    set_: SetOpt = None,
    source: FromOpt = None,
    accept_new: AcceptNewOpt = False,
) -> None:
    """Stream the image from the head (or --from NODE) to every node whose image ID differs."""
    from sparkfleet.apply.images import distribute
    from sparkfleet.errors import ClusterError

    planned, ref, transports = _setup(recipe, cluster, set_, accept_new)
    src = source or planned.ranks[0].node.name
    if src not in transports:
        raise ClusterError(f"--from {src}: not a node of this deployment ({', '.join(transports)})")
    _show(distribute(ref, src, transports, progress=_progress), ref)


def register(app: typer.Typer) -> None:
    """Add `image build` and `image push`."""
    image_app.command("build")(build_cmd)
    image_app.command("push")(push_cmd)
    app.add_typer(image_app, name="image")
