"""``stage``: put a recipe's files in place on every node, or check them with ``--verify``."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from sparkfleet.cli.console import console, err_console, table
from sparkfleet.cli.options import AcceptNewOpt, ClusterOpt, JsonOpt, NameOpt, RecipeArg, SetOpt, build_plan
from sparkfleet.errors import UsageError

MethodOpt = Annotated[
    str,
    typer.Option("--method", help="How a sync from a source node reaches the others: pipeline (each node "
                 "forwards to the next while writing) or push (the source to all at once)."),
]  # fmt: skip


def stage(
    recipe: RecipeArg,
    cluster: ClusterOpt = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Check every staged file in full against its ledger; write nothing.")
    ] = False,
    set_: SetOpt = None,
    name: NameOpt = None,
    as_json: JsonOpt = False,
    accept_new: AcceptNewOpt = False,
    method: MethodOpt = "pipeline",
) -> None:
    """Run the recipe's staging entries and composed_model on every node in parallel.

    Row tables whose ledger matches the source are checked by sampling and left alone.
    Changed or damaged ones are repacked chunk by chunk. --verify checks in full, writes nothing.
    """
    # Imported here, not at module level: they pull in rich.progress and the transports, and
    # `sparkfleet --help` should not pay for them.
    from sparkfleet.apply.staging.hub import HubReport
    from sparkfleet.apply.staging.phase import rich_progress
    from sparkfleet.apply.staging.phase import stage as run_stage
    from sparkfleet.nodes.transport import connected

    if method not in ("pipeline", "push"):
        raise UsageError(f"--method {method!r}: choose pipeline or push")
    planned = build_plan(recipe, cluster, set_, None, name)
    if not planned.staging:
        if as_json:  # stdout holds the JSON alone: no rows
            typer.echo("[]")
        (err_console if as_json else console).print(f"{planned.recipe_source}: nothing to stage")
        return
    nodes = (r.node for r in planned.ranks)
    with connected(nodes, accept_new_host_keys=accept_new) as transports, rich_progress(err_console) as progress:
        phase = run_stage(planned, transports, verify=verify, progress=progress,
                          fanout="push" if method == "push" else "pipeline")  # fmt: skip
    rows = phase.rows()
    for f in [] if as_json else phase.of(HubReport):
        console.print(
            f"from the Hub onto {f.node}: {f.bytes_fetched:,} bytes ({len(f.fetched)} file(s) fetched, "
            f"{len(f.present)} already there); between nodes: {phase.bytes_between_nodes:,} bytes"
        )
        for file, size, why in f.skipped:
            console.print(f"  not fetched: {file} ({size:,} bytes): {why}")
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        shown = table("verify" if verify else "stage", "node", "rank", "step", "file", "found", "done", "written")
        for row in rows:
            shown.add_row(str(row["node"]), str(row["rank"]), str(row["step"]), str(row["path"]),
                          str(row["status"]), str(row["action"]), f"{int(str(row['bytes_written'])):,} B")  # fmt: skip
        console.print(shown)
    if verify:
        phase.check()


COMMANDS = {"stage": stage}
