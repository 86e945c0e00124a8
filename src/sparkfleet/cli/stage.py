"""``stage``: put a recipe's files in place on every node, or check them with ``--verify``."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from sparkfleet.cli.console import console, err_console
from sparkfleet.cli.options import ClusterOpt, JsonOpt, NameOpt, RecipeArg, SetOpt, build_plan
from sparkfleet.errors import StagingError

NODE_SIDE_KINDS = ("sparse-rows", "composed")
VerifyOpt = Annotated[
    bool, typer.Option("--verify", help="Check every staged file in full against its ledger; write nothing.")
]
AcceptNewOpt = Annotated[
    bool, typer.Option("--insecure-accept-new", help="Accept unknown SSH host keys (first contact only).")
]


def stage(
    recipe: RecipeArg,
    cluster: ClusterOpt = None,
    verify: VerifyOpt = False,
    set_: SetOpt = None,
    name: NameOpt = None,
    as_json: JsonOpt = False,
    accept_new: AcceptNewOpt = False,
) -> None:
    """Run the recipe's staging entries and composed_model on every node in parallel.

    Row tables whose ledger matches the source are checked by sampling and left alone.
    Changed or damaged ones are repacked chunk by chunk. --verify checks in full, writes nothing.
    """
    # Imported here, not at module level: they pull in rich.progress and the transports, and
    # `sparkfleet --help` should not pay for them.
    from rich.table import Table

    from sparkfleet.apply.distribute import distribute, rich_progress
    from sparkfleet.apply.staging.runner import stage_all
    from sparkfleet.nodes.transport import transport_for

    planned = build_plan(recipe, cluster, set_, None, name)
    nodes = {r.node.name: r.node for r in planned.ranks}
    steps = [s for s in planned.staging if s.kind in NODE_SIDE_KINDS]
    if not planned.staging:
        console.print(f"{planned.recipe_source}: nothing to stage")
        return
    transports = {n: transport_for(node, accept_new_host_keys=accept_new) for n, node in nodes.items()}
    try:
        with rich_progress(err_console) as progress:
            if not verify:
                distribute(planned, transports, progress)
            reports = stage_all(
                steps, transports, verify=verify, progress=progress, pythons={n: x.python for n, x in nodes.items()}
            )
    finally:
        for transport in transports.values():
            transport.close()

    rows: list[dict[str, object]] = []
    for rep in sorted(reports, key=lambda r: (r.step_id, r.rank)):
        for out in rep.outputs:
            rows.append({"node": rep.node, "rank": rep.rank, "step": rep.step_id, "path": out.path,
                         "status": out.status, "action": out.action, "bytes_written": out.bytes_written,
                         "chunks_rewritten": out.chunks_rewritten, "chunks_total": out.chunks_total})  # fmt: skip
        if rep.composed is not None:
            c = rep.composed
            rows.append({"node": rep.node, "rank": rep.rank, "step": rep.step_id, "path": c.model_dir,
                         "status": "; ".join(c.problems) or "ok", "action": "verified" if verify else "composed",
                         "bytes_written": 0, "links": c.links, "hard_links": c.hard_links,
                         "extra_mounts": list(c.extra_mounts)})  # fmt: skip
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        table = Table(title="verify" if verify else "stage", title_justify="left")
        for col in ("node", "rank", "step", "file", "found", "done", "written"):
            table.add_column(col)
        for row in rows:
            table.add_row(str(row["node"]), str(row["rank"]), str(row["step"]), str(row["path"]),
                          str(row["status"]), str(row["action"]), f"{int(str(row['bytes_written'])):,} B")  # fmt: skip
        console.print(table)
    if verify:
        bad = [r for r in rows if r["status"] != "ok"]
        if bad:
            first = bad[0]
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise StagingError(str(first["node"]), f"{first['path']} is not as staged: {first['status']}{more}")


def register(app: typer.Typer) -> None:
    """Add ``stage``."""
    app.command("stage")(stage)
