"""``sparkfleet switch OLD RECIPE``: replace a deployment behind the gateway, losing no request
(apply/switch.py says how it chooses between side by side and one after the other)."""

from __future__ import annotations

from typing import Annotated

import typer

from sparkfleet.cli.console import console, plain
from sparkfleet.cli.options import ClusterOpt, EnvOpt, NameOpt, RecipeArg, SetOpt, VariantOpt, parse_env


def switch(
    old: Annotated[str, typer.Argument(help="The running deployment to replace.")],
    recipe: RecipeArg,
    cluster: ClusterOpt = None,
    set_: SetOpt = None,
    env: EnvOpt = None,
    name: NameOpt = None,
    variant: VariantOpt = "base",
    timeout: Annotated[float | None, typer.Option(help="Seconds to wait for NEW's readiness.")] = None,
) -> None:
    """Bring NEW (RECIPE) up and move OLD's traffic to it, then stop OLD: side by side where both
    fit (NEW joins the route, OLD is drained), else drain, down, up, release the held requests."""
    from sparkfleet.apply.configurations import ConfigSpec
    from sparkfleet.apply.switch import switch as run

    spec = ConfigSpec(recipe, variant, tuple(set_ or ()), parse_env(env), cluster, name)
    done = run(old, spec, say=lambda line: plain(line, err=True), timeout=timeout)
    console.print(f"[green]switched[/] {old} -> {done.result.name} ({done.way}) at [bold]{done.result.endpoint}[/]",
                  soft_wrap=True)  # fmt: skip


COMMANDS = {"switch": switch}
