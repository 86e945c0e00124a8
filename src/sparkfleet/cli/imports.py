"""``import mia-env``, ``import sparkrun``, ``import eugr``: a launcher config brought in as a recipe."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sparkfleet.cli.app import group
from sparkfleet.cli.console import console, err_console
from sparkfleet.errors import UsageError

if TYPE_CHECKING:
    from sparkfleet.importers.report import ImportResult

import_app = group("Turn a launcher profile or a sparkrun recipe into a sparkfleet recipe.")
COMMANDS = {"import": import_app}

FileArg = Annotated[Path, typer.Argument(help="The file to import.")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Write the recipe here (default: stdout).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite existing output files.")]


def _write(path: Path, text: str, force: bool) -> None:
    if path.exists() and not force:
        raise UsageError(f"{path}: already exists (use --force to overwrite)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _emit(result: ImportResult, out: Path | None, cluster_out: Path | None, force: bool) -> None:
    # Everything the user must look at, on stderr so stdout stays a clean recipe.
    for title, notes, style in (
        ("placeholders to fill in", result.placeholders, "yellow"),
        ("not carried over", result.not_carried, "cyan"),
        ("NOT UNDERSTOOD", result.not_understood, "red"),
    ):
        if notes:
            err_console.print(f"[bold {style}]{title} ({len(notes)}):[/]")
            for note in notes:
                err_console.print(f"  {note.key}: {note.detail}", markup=False, soft_wrap=True)
    if out is None:
        typer.echo(result.recipe_toml, nl=False)
        if result.cluster_toml and cluster_out is not None:
            _write(cluster_out, result.cluster_toml, force)
        return
    _write(out, result.recipe_toml, force)
    console.print(f"[green]wrote[/] {out}")
    if result.cluster_toml:
        target = cluster_out or out.parent / "cluster.toml"
        _write(target, result.cluster_toml, force)
        console.print(f"[green]wrote[/] {target}")


@import_app.command("mia-env")
def mia_env(
    file: FileArg,
    out: OutOpt = None,
    cluster_out: Annotated[Path | None, typer.Option(help="Cluster file (default: cluster.toml beside --out).")] = None,
    no_tp4: Annotated[bool, typer.Option("--no-tp4", help="A start.sh (3-node) profile, not start-tp4.sh.")] = False,
    force: ForceOpt = False,
) -> None:
    """Import a MiaAI start-tp4.sh profile (.env.tp4): same flags, same container env, same staging."""
    from sparkfleet.importers.mia_env import import_mia_env
    from sparkfleet.importers.shell_profile import read_profile

    _emit(import_mia_env(read_profile(str(file)), tp4=not no_tp4), out, cluster_out, force)


@import_app.command("sparkrun")
def sparkrun(
    file: FileArg,
    out: OutOpt = None,
    force: ForceOpt = False,
    sparkrun_version: Annotated[
        str | None,
        typer.Option(
            "--sparkrun-version",
            help="Follow this sparkrun release's rules "
            "(default: the recipe's min_sparkrun_version, else the current release 0.4.2).",
        ),
    ] = None,
) -> None:
    """Import a sparkrun YAML recipe: the same engine command, container and env."""
    # PyYAML is imported only here, to keep `sparkfleet` start-up fast.
    from sparkfleet.importers.sparkrun import import_sparkrun, read_sparkrun

    _emit(import_sparkrun(read_sparkrun(file), sparkrun_version=sparkrun_version), out, None, force)


@import_app.command("eugr")
def eugr(file: FileArg, out: OutOpt = None, force: ForceOpt = False) -> None:
    """Import an eugr/spark-vllm-docker recipe (recipes/*.yaml) as a recipe, or its .env as a cluster file."""
    from sparkfleet.importers.eugr import import_eugr

    _emit(import_eugr(str(file)), out, None, force)
