"""``validate`` and ``plan``: read a recipe and show exactly what would run, contacting nothing."""

from __future__ import annotations

import json

import typer

from sparkfleet.cli.console import console
from sparkfleet.cli.options import ClusterOpt, EnvOpt, JsonOpt, NameOpt, RecipeArg, SetOpt, build_plan
from sparkfleet.plan.build import check_plannable
from sparkfleet.spec.recipe import load_recipe


def validate(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Check a recipe: exit 0 when it is valid, 2 with one line naming the problem otherwise."""
    loaded = load_recipe(recipe, tuple(set_ or ()))
    check_plannable(loaded)  # what plan checks before it needs a cluster
    console.print(f"[green]ok[/] {loaded.source}: {loaded.engine}, {loaded.required_nodes} node(s), "
                  f"tp={loaded.tensor_parallel_size} pp={loaded.pipeline_parallel_size}", soft_wrap=True)  # fmt: skip


def plan_cmd(
    recipe: RecipeArg,
    cluster: ClusterOpt = None,
    set_: SetOpt = None,
    env: EnvOpt = None,
    name: NameOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show what `up` will do on every node: commands, env (with sources), mounts, staging."""
    from sparkfleet.plan.render import plan_json, print_plan  # rich tables only when printing

    planned = build_plan(recipe, cluster, set_, env, name)
    if as_json:
        typer.echo(json.dumps(plan_json(planned), indent=2, sort_keys=False))
    else:
        print_plan(planned, console)


def register(app: typer.Typer) -> None:
    """Add validate and plan."""
    app.command("validate")(validate)
    app.command("plan")(plan_cmd)
