"""``sparkfleet doctor [RECIPE] [--cluster FILE] [--json]``: is every node ready?"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from sparkfleet.cli.console import console
from sparkfleet.cli.options import ClusterOpt, EnvOpt, JsonOpt, NameOpt, SetOpt

OptionalRecipeArg = Annotated[
    Path | None,
    typer.Argument(help="A recipe (folder or recipe.toml); without it only the nodes are checked."),
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for each node's answer.")]
AcceptNewOpt = Annotated[
    bool, typer.Option("--insecure-accept-new", help="Accept unknown SSH host keys (first contact only).")
]
_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def doctor(
    recipe: OptionalRecipeArg = None,
    cluster: ClusterOpt = None,
    set_: SetOpt = None,
    env: EnvOpt = None,
    name: NameOpt = None,
    as_json: JsonOpt = False,
    timeout: TimeoutOpt = 15.0,
    accept_new: AcceptNewOpt = False,
) -> None:
    """Check every node in parallel: SSH, docker, GPUs, RDMA, fabric, disk, memory, image, model,
    ports, clocks. Exit 0 when nothing failed, 1 otherwise."""
    # The library (threads, probes, plan) is imported here so other commands start fast.
    from sparkfleet.cli.options import build_plan
    from sparkfleet.doctor.history import record_doctor
    from sparkfleet.doctor.run import memory_for, run_doctor, sort_for_display, spec_for
    from sparkfleet.nodes.transport import transport_for
    from sparkfleet.plan.memory import render_memory_plans
    from sparkfleet.spec.cluster import load_cluster
    from sparkfleet.state.store import Store

    if recipe is not None:
        planned = build_plan(recipe, cluster, set_, env, name)
        nodes = [r.node for r in planned.ranks]
        spec, memory = spec_for(load_cluster(cluster), planned), memory_for(planned)
    else:
        inventory = load_cluster(cluster)
        nodes, spec, memory = list(inventory.nodes), spec_for(inventory), None
    transports = {n.name: transport_for(n, accept_new_host_keys=accept_new) for n in nodes}
    try:
        report = run_doctor(spec, transports, memory, timeout=timeout)
    finally:
        for t in transports.values():
            t.close()
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        for check in sort_for_display(report.checks):
            style = _STYLE[check.status]
            head = f"[{style}]{check.status.upper():4}[/] {check.id:<20} {check.node:<10}"
            console.print(
                f"{head} {escape(check.evidence)}",
                markup=True,
                highlight=False,
                soft_wrap=True,
            )
            if check.fix and check.status != "pass":
                console.print(f"{'':36} fix: {check.fix}", markup=False, highlight=False, soft_wrap=True)
        if report.memory:
            console.print("\n[bold]memory per rank[/] (device memory from each node's facts):")
            for line in render_memory_plans(report.memory):
                console.print(line, markup=False, highlight=False, soft_wrap=True)
        counts = report.counts()
        console.print(
            f"{counts['fail']} failed, {counts['warn']} warnings, {counts['pass']} passed "
            f"on {len(spec.nodes)} node(s) in {report.seconds:.2f} s"
        )
    # The dashboard shows each node's last run.
    record_doctor(Store(), report.checks, report.seconds, str(recipe) if recipe is not None else None)
    if report.failed:
        # SystemExit, not typer.Exit: main() runs click with standalone_mode=False, where
        # typer.Exit's code would be returned and lost.
        raise SystemExit(1)


def register(app: typer.Typer) -> None:
    """Add doctor."""
    app.command("doctor")(doctor)
