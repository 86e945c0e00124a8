"""Options shared by several commands, and the recipe + cluster → Plan step they all start with."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sparkfleet.config.secrets import MASK, is_secret
from sparkfleet.errors import UsageError

if TYPE_CHECKING:
    from sparkfleet.plan.model import Plan

RecipeArg = Annotated[Path, typer.Argument(help="A recipe.toml file, or a folder holding one.")]
ClusterOpt = Annotated[Path | None, typer.Option("--cluster", "-c", help="Cluster inventory (default: this machine).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a recipe key: key.path=value.")]
EnvOpt = Annotated[
    list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE for every rank (KEY alone: from your env).")
]
NameOpt = Annotated[str | None, typer.Option("--name", help="Deployment name (default: the recipe's folder).")]
# --json is a flag in every command: the result as JSON on stdout, nothing else there (a file a
# command writes is --out/-o; cli/renamed.py keeps the old spellings working).
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout (nothing else there).")]
AcceptNewOpt = Annotated[
    bool, typer.Option("--insecure-accept-new", help="Accept unknown SSH host keys (first contact only).")
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", help="Where the server's API key is: env:NAME, file:PATH or - (stdin); never the key "
                 "itself. Default: OPENAI_API_KEY, then a deployment's own key."),
]  # fmt: skip
# What bench and eval commands measure: a deployment or any OpenAI-compatible server.
TargetArg = Annotated[str, typer.Argument(help="Deployment name, or the server's URL (http://host:port).")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Model id (default: the first of GET /v1/models).")]
LabelOpt = Annotated[str | None, typer.Option("--label", help="A label stored with the run.")]
VariantOpt = Annotated[str, typer.Option("--variant", help="Which [variants.NAME] overlay of the recipe (base: none).")]
ApiOpt = Annotated[str, typer.Option(help="chat or completions.")]
RequestTimeoutOpt = Annotated[float, typer.Option(help="Seconds allowed per request.")]
NodeTimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for each node's answer.")]


def out_files(help: str) -> Any:
    """``--out``/``-o FILE``, repeatable (as ``list[Path] | None``): files a command also writes."""
    return typer.Option("--out", "-o", metavar="FILE", help=help)


def parse_env(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """``--env`` items as pairs; ``KEY`` alone takes the value from this environment."""
    pairs: list[tuple[str, str]] = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not key or not (key.replace("_", "a").isalnum()) or key[0].isdigit():
            shown = f"{key}={MASK}" if sep and is_secret(key) else item  # a mistyped name still holds the token
            raise UsageError(f"--env {shown!r}: expected KEY=VALUE with a valid variable name")
        if not sep:
            if key not in os.environ:
                raise UsageError(f"--env {key}: not set in this environment")
            value = os.environ[key]
        if "\n" in value or "\r" in value or "\0" in value:
            raise UsageError(f"--env {key}: a value cannot hold a newline or NUL (it is one line of an env file)")
        pairs.append((key, value))
    return tuple(pairs)


def build_plan(
    recipe: Path,
    cluster: Path | None,
    sets: list[str] | None,
    env: list[str] | None,
    name: str | None,
    variant: str = "base",
) -> Plan:
    """Load, validate and plan: the first step of plan, up, stage, doctor and export."""
    # pydantic and the planner load here, not with the module, so every --help stays fast.
    from sparkfleet.config.cluster import load_cluster
    from sparkfleet.config.recipe import deployment_name, load_recipe
    from sparkfleet.plan.build import plan
    from sparkfleet.plan.model import Overrides

    loaded = load_recipe(recipe, tuple(sets or ()), variant)
    inventory = load_cluster(cluster)
    return plan(loaded, inventory, deployment_name(recipe), Overrides(env=parse_env(env), name=name))
