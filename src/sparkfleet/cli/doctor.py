"""``sparkfleet doctor [RECIPE] [--cluster FILE] [--json]``: is every node ready?"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from sparkfleet.cli.console import console, plain
from sparkfleet.cli.options import AcceptNewOpt, ClusterOpt, EnvOpt, JsonOpt, NameOpt, NodeTimeoutOpt, SetOpt

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sparkfleet.doctor.pairs import Thresholds
    from sparkfleet.doctor.targets import Check, DoctorSpec
    from sparkfleet.nodes.transport.base import Transport

FabricToolOpt = Annotated[
    str,
    typer.Option("--fabric-tool", help="What measures bandwidth: auto (iperf3 where both nodes have it, else "
                 "sparkfleet's stream test, Python on the nodes), iperf3 or stdlib."),
]  # fmt: skip
NcclOpt = Annotated[
    bool,
    typer.Option("--nccl", help="With a recipe: an all-reduce/all-gather sweep on the plan's ranks (NCCL, or gloo "
                 "without GPUs), in each rank's Python or image with its planned NCCL_* settings."),
]  # fmt: skip
_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def doctor(
    recipe: Annotated[
        Path | None, typer.Argument(help="A recipe (folder or recipe.toml); without it only the nodes are checked.")
    ] = None,
    cluster: ClusterOpt = None,
    set_: SetOpt = None,
    env: EnvOpt = None,
    name: NameOpt = None,
    as_json: JsonOpt = False,
    timeout: NodeTimeoutOpt = 15.0,
    accept_new: AcceptNewOpt = False,
    fabric: Annotated[
        bool,
        typer.Option("--fabric", help="Measure every pair of nodes over the fabric (iperf3, ping, path MTU) instead."),
    ] = False,
    fabric_seconds: Annotated[int, typer.Option(min=1, max=60, help="Seconds of each iperf3 test.")] = 2,
    fabric_fraction: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="A direction below this × the fleet's median fails.")
    ] = 0.7,
    fabric_max_loss: Annotated[float, typer.Option(min=0.0, help="Ping loss (%) above this fails.")] = 1.0,
    fabric_tool: FabricToolOpt = "auto",
    nccl: NcclOpt = False,
    nccl_max_mib: Annotated[int, typer.Option(min=1, help="The sweep's largest message, MiB.")] = 1024,
    nccl_port: Annotated[int, typer.Option(min=1, max=65535, help="Rank 0's rendezvous port.")] = 29511,
    nccl_backend: Annotated[str, typer.Option(help="auto (nccl with GPUs, else gloo), nccl or gloo.")] = "auto",
    nccl_python: Annotated[
        str | None, typer.Option(help="The interpreter with torch on every node (default: the rank's).")
    ] = None,
) -> None:
    """Check every node in parallel: SSH, docker, GPUs, RDMA, fabric, disk, memory, image, model,
    ports, clocks. Exit 0 when nothing failed, 1 otherwise."""
    # The library (threads, probes, plan) is imported here so other commands start fast.
    from sparkfleet.cli.options import build_plan
    from sparkfleet.config.cluster import load_cluster
    from sparkfleet.doctor.history import record_doctor
    from sparkfleet.doctor.run import memory_for, run_doctor, sort_for_display, spec_for
    from sparkfleet.nodes.transport import connected
    from sparkfleet.plan.memory import render_memory_plans
    from sparkfleet.state.store import Store

    if nccl and recipe is None:
        raise typer.BadParameter("--nccl runs on a recipe's ranks: give the recipe", param_hint="RECIPE")
    if fabric_tool not in ("auto", "iperf3", "stdlib"):
        raise typer.BadParameter(f"{fabric_tool!r}: one of auto, iperf3, stdlib", param_hint="--fabric-tool")
    if nccl_backend not in ("auto", "nccl", "gloo"):
        raise typer.BadParameter(f"{nccl_backend!r}: one of auto, nccl, gloo", param_hint="--nccl-backend")
    if recipe is not None:
        planned = build_plan(recipe, cluster, set_, env, name)
        nodes = [r.node for r in planned.ranks]
        spec, memory = spec_for(load_cluster(cluster), planned), memory_for(planned)
    else:
        inventory = load_cluster(cluster)
        nodes, spec, memory = list(inventory.nodes), spec_for(inventory), None
    with connected(nodes, accept_new_host_keys=accept_new) as transports:
        if fabric:
            from sparkfleet.doctor.collective import render_collective, run_collective, sweep_ranks
            from sparkfleet.doctor.pairs import Thresholds

            pairs = _fabric(spec, transports, recipe, as_json, not nccl, seconds=fabric_seconds, timeout=timeout,
                            thresholds=Thresholds(fabric_fraction, fabric_max_loss), tool=fabric_tool)  # fmt: skip
            if nccl:  # the collective sweep beside the pair test just run
                sweep = run_collective(sweep_ranks(planned, nccl_python), transports, max_bytes=nccl_max_mib << 20,
                                       port=nccl_port, backend=nccl_backend, fabric_report=pairs,
                                       link_from="doctor --fabric, this run")  # fmt: skip
                if as_json:
                    typer.echo(json.dumps({"fabric": pairs, "collective": sweep.to_json()}, indent=2))
                else:
                    console.print()
                    for line in render_collective(sweep):
                        plain(line)
                    _print_checks(list(sweep.checks))
            if not pairs["ok"] or (nccl and sweep.failed):
                raise SystemExit(1)
            return
        report = run_doctor(spec, transports, memory, timeout=timeout)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_checks(sort_for_display(report.checks))
        if report.memory:
            console.print("\n[bold]memory per rank[/] (device memory from each node's facts):")
            for line in render_memory_plans(report.memory):
                plain(line)
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


def _print_checks(checks: list[Check]) -> None:
    width = max([10, *(len(c.node) for c in checks)])  # pairs (`node0<->node3`) are wider than nodes
    for check in checks:
        style = _STYLE[check.status]
        head = f"[{style}]{check.status.upper():4}[/] {check.id:<20} {check.node:<{width}}"
        console.print(f"{head} {escape(check.evidence)}", markup=True, highlight=False, soft_wrap=True)
        if check.fix and check.status != "pass":
            plain(f"{'':{width + 26}} fix: {check.fix}")


def _fabric(spec: DoctorSpec, transports: Mapping[str, Transport], recipe: Path | None, as_json: bool, alone: bool,
            *, seconds: int, thresholds: Thresholds, timeout: float, tool: str) -> dict[str, Any]:  # fmt: skip
    """`doctor --fabric`: the pair test, printed or as JSON (not alone: the caller prints it in its
    own), kept in doctor's history; its JSON form."""
    from sparkfleet.doctor.history import record_fabric
    from sparkfleet.doctor.pairs import render_matrix, run_fabric
    from sparkfleet.doctor.run import sort_for_display
    from sparkfleet.state.store import Store

    report = run_fabric(spec.nodes, transports, seconds=seconds, thresholds=thresholds, timeout=timeout, tool=tool)
    if as_json:
        if alone:
            typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        for line in render_matrix(report):
            plain(line)
        console.print()
        _print_checks(sort_for_display(report.checks))
        failed = len(report.failed)
        console.print(
            f"{failed} failed on {len(report.pairs)} pair(s) of {len(report.nodes)} node(s) "
            f"in {len(report.rounds)} round(s), {report.seconds:.2f} s"
        )
    record_fabric(Store(), report.to_json(), report.seconds, str(recipe) if recipe is not None else None)
    return report.to_json()


COMMANDS = {"doctor": doctor}
