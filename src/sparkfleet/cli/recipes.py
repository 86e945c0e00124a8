"""``validate`` and ``plan``: read a recipe and show exactly what would run, contacting nothing."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from sparkfleet.cli.console import console, plain, warn
from sparkfleet.cli.options import (
    ClusterOpt,
    EnvOpt,
    JsonOpt,
    NameOpt,
    RecipeArg,
    SetOpt,
    VariantOpt,
    build_plan,
)
from sparkfleet.errors import PlanError, RecipeError

StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Refuse when a recipe/--env value overrides a per-node cluster value, or when an imported "
        "recipe lists what its import could not carry over (not_carried).",
    ),
]


def validate(recipe: RecipeArg, set_: SetOpt = None, cluster: ClusterOpt = None, strict: StrictOpt = False) -> None:
    """Check a recipe and every variant it defines (and, with --cluster, the cluster file): exit 0
    when all are valid, 2 with one line naming the problem otherwise. What an import could not
    carry over is a warning per item (--strict refuses)."""
    from sparkfleet.config.cluster import load_cluster
    from sparkfleet.config.recipe import load_recipe, recipe_variants
    from sparkfleet.plan.build import check_plannable, secret_arg_notes

    loaded = load_recipe(recipe, tuple(set_ or ()))
    inventory = load_cluster(cluster) if cluster is not None else None
    check_plannable(loaded, inventory)  # what plan checks before it places ranks
    variants = recipe_variants(recipe)[1:]
    for name in variants:
        check_plannable(load_recipe(recipe, tuple(set_ or ()), name))
    report_not_carried(loaded.source, loaded.not_carried, strict)
    for note in secret_arg_notes(loaded):
        warn(f"{loaded.source}: {note}")
    more = f", variants: {', '.join(variants)}" if variants else ""
    console.print(f"[green]ok[/] {loaded.source}: {loaded.engine}, {loaded.required_nodes} node(s), "
                  f"tp={loaded.tensor_parallel_size} pp={loaded.pipeline_parallel_size}{more}",
                  soft_wrap=True)  # fmt: skip


def plan_cmd(
    recipe: RecipeArg,
    cluster: ClusterOpt = None,
    set_: SetOpt = None,
    env: EnvOpt = None,
    name: NameOpt = None,
    as_json: JsonOpt = False,
    variant: VariantOpt = "base",
    diff: Annotated[
        tuple[str, str] | None,
        typer.Option("--diff", help="Two variants: per rank, the argv words, env keys and image that differ."),
    ] = None,
    strict: StrictOpt = False,
) -> None:
    """Show what `up` will do on every node: commands, env (with sources), mounts, staging."""
    from sparkfleet.plan.render import plan_json, print_plan  # rich tables only when printing

    if diff is not None:
        from sparkfleet.plan.diff import diff_json, diff_lines

        a, b = (build_plan(recipe, cluster, set_, env, name, v) for v in diff)
        if as_json:
            typer.echo(json.dumps(diff_json(a, b), indent=2))
        else:
            for line in diff_lines(a, b):
                plain(line)
        return
    planned = build_plan(recipe, cluster, set_, env, name, variant)
    # The plan's per-node overrides on stderr (the JSON on stdout stays clean); --strict refuses.
    report_not_carried(planned.recipe_source, planned.not_carried, strict)
    if strict and planned.warnings:
        raise PlanError(f"{planned.recipe_source}: --strict: " + "; ".join(w.message for w in planned.warnings))
    for w in planned.warnings:
        warn(w.message)
    for note in planned.secret_args:
        warn(f"{planned.recipe_source}: {note}")
    if as_json:
        typer.echo(json.dumps(plan_json(planned), indent=2, sort_keys=False))
    else:
        print_plan(planned, console)
        from sparkfleet.plan.staging.hub import Hub

        for step in (s for s in planned.staging if isinstance(s.entry, Hub)):
            from sparkfleet.apply.staging.hub import print_rules  # only then: it loads the runners

            print_rules(step, console)


def report_not_carried(source: str, items: tuple[str, ...], strict: bool) -> None:
    """One warning per item an import could not carry over, on stderr; --strict refuses them."""
    if strict and items:
        raise RecipeError(f"{source}: --strict: not carried over by the import: " + "; ".join(items))
    for item in items:
        warn(f"{source}: not carried over: {item}")


COMMANDS = {"validate": validate, "plan": plan_cmd}
