"""``up``, ``down``, ``status`` and ``logs``."""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from sparkfleet.cli.console import console, err_console, plain, table
from sparkfleet.cli.options import (
    AcceptNewOpt,
    ClusterOpt,
    EnvOpt,
    JsonOpt,
    NameOpt,
    RecipeArg,
    SetOpt,
    VariantOpt,
    parse_env,
)
from sparkfleet.errors import LeftoverError, UsageError

if TYPE_CHECKING:
    from rich.table import Table


class _Progress:
    """A live table, one row per node, updated as up goes."""

    def __init__(self, nodes: list[tuple[int, str]]) -> None:
        from rich.live import Live

        self.rows: dict[str, tuple[int, str]] = {n: (r, "waiting") for r, n in nodes}
        self.phase = "planning"
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.live = Live(self._table(), console=err_console, refresh_per_second=4, transient=False)

    def _table(self) -> Table:
        shown = table(f"{self.phase}  ({time.monotonic() - self.start:.1f}s)", "rank", "node", "state")
        for node, (rank, text) in sorted(self.rows.items(), key=lambda kv: kv[1][0]):
            shown.add_row(str(rank), node, text)
        return shown

    def __call__(self, node: str | None, rank: int | None, message: str) -> None:
        with self.lock:
            if node is None:
                self.phase = message
            else:
                self.rows[node] = (rank if rank is not None else self.rows[node][0], message)
            self.live.update(self._table())


def up(
    recipe: RecipeArg,
    cluster: ClusterOpt = None,
    set_: SetOpt = None,
    env: EnvOpt = None,
    name: NameOpt = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds to wait for readiness.")] = None,
    accept_new: AcceptNewOpt = False,
    allow_image_mismatch: Annotated[
        bool, typer.Option("--allow-image-mismatch", help="Start even if nodes hold different image IDs.")
    ] = False,
    variant: VariantOpt = "base",
    replace: Annotated[
        str | None, typer.Option("--replace", help="Replace this running deployment, losing no request (= switch).")
    ] = None,
) -> None:
    """Start a deployment on every node; done only when it really serves (else everything is stopped).
    What it was started from, and whether it passed, is recorded for `sparkfleet rollback`."""
    from sparkfleet.apply.configurations import ConfigSpec

    if replace is not None:  # `sparkfleet switch REPLACE RECIPE …`
        from sparkfleet.cli.switch import switch

        switch(replace, recipe, cluster, set_, env, name, variant, timeout)
        return
    from sparkfleet.nodes.agent.session import open_sessions
    from sparkfleet.nodes.transport import transport_for

    spec = ConfigSpec(recipe, variant, tuple(set_ or ()), parse_env(env), cluster, name)
    planned = spec.plan()
    # The nodes' agents boot while the rest of up loads: one transport per node, made now.
    transports = {r.node.name: transport_for(r.node, accept_new_host_keys=accept_new) for r in planned.ranks}
    open_sessions(transports, {r.node.name: r.node.python for r in planned.ranks})
    from sparkfleet.apply.up import up as run_up

    progress = _Progress([(r.rank, r.node.name) for r in planned.ranks])
    try:
        with progress.live:
            result = run_up(
                planned,
                config=spec,
                report=progress,
                timeout=timeout,
                allow_image_mismatch=allow_image_mismatch,
                connect=lambda node: transports[node.name],
            )
            progress(None, None, f"ready in {result.seconds:.1f}s")
    except KeyboardInterrupt as exc:
        # typer turns KeyboardInterrupt into exit code 130 and drops what up said of its rollback.
        err_console.print(f"[bold red]interrupted[/]: {escape(str(exc))}" if str(exc) else "[bold red]interrupted[/]")
        raise SystemExit(130) from None
    console.print(f"[green]ready[/] {result.name} at [bold]{result.endpoint}[/] "
                  f"(smoke answer: {result.smoke_answer.strip()[:60]!r})")  # fmt: skip


def rollback(name: Annotated[str, typer.Argument(help="Deployment name.")]) -> None:
    """Take NAME's running configuration down and bring back the last one that passed its gate
    (ready, smoke-tested, and its quality run if one was made); refuses, saying why, when none did."""
    from sparkfleet.apply.configurations import rollback as run_rollback

    target, result = run_rollback(name, report=plain)
    console.print(f"[green]rolled back[/] {result.name} to configuration #{target.id} "
                  f"(variant {target.variant}) at [bold]{result.endpoint}[/] in {result.seconds:.1f}s")  # fmt: skip


def down(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster", "-c", help="With --sweep: the cluster whose nodes to search (default: this machine)."
        ),
    ] = None,
    sweep_: Annotated[
        bool,
        typer.Option(
            "--sweep",
            help="Find the deployment's ranks by name on every node of --cluster (this machine without one), "
            "whoever started them, list them with their owner, and stop them (when the local record is lost).",
        ),
    ] = False,
) -> None:
    """Stop every rank of a deployment this controller started (idempotent)."""
    from sparkfleet.apply.down import find_by_name, sweep, take_down
    from sparkfleet.config.cluster import load_cluster
    from sparkfleet.nodes.identity import when
    from sparkfleet.state.deployments import Deployments, controller_gone

    if sweep_:
        # Without --cluster: this machine, the local cluster a recipe runs on without one.
        nodes = {n.name: n for n in load_cluster(cluster).nodes}
        found = find_by_name(nodes, name)
        if not found:
            console.print(f"{name}: nothing of that name on any node of {cluster or 'the local cluster'}")
            return
        console.print(f"found {len(found)} rank(s) of {name!r}:")
        for item in found:
            console.print(f"  {item.describe()}", highlight=False, soft_wrap=True)
        sweep(found, nodes)
        console.print(f"[green]stopped[/] {name}: {len(found)} rank(s) swept")
        return
    record = Deployments().require(name, f"if its ranks still run somewhere, `sparkfleet down {name} --sweep "
                                         "--cluster FILE` lists them with their owner and stops them")  # fmt: skip
    if controller_gone(record):
        console.print(f"{name}: the controller of this starting instance is gone "
                      f"(pid {record.owner_pid} on {record.owner_host}); stopping what it started",
                      highlight=False, soft_wrap=True)  # fmt: skip
    report = take_down(record)
    if report.stopped:
        console.print(f"[green]stopped[/] {name}: " + ", ".join(report.stopped), highlight=False, soft_wrap=True)
    else:
        console.print(f"{name}: nothing was running")
    orphans = report.orphans
    for instance in sorted({f.instance or "?" for f in orphans}):
        ranks = [f for f in orphans if (f.instance or "?") == instance]
        console.print(f"{name}: also an instance {instance} this controller started at {when(ranks[0].started)} "
                      "(its record was replaced):", highlight=False, soft_wrap=True)  # fmt: skip
        for item in ranks:
            console.print(f"  {item.describe()}", highlight=False, soft_wrap=True)
    if orphans:
        console.print(f"[green]stopped[/] {name}: {len(orphans)} rank(s) of earlier instance(s)")
    pids = {f.ident for f in report.leftovers if f.kind == "process"}
    for memory in report.memory:
        plain(f"  {memory.describe(pids)}")
    if report.problem():
        raise LeftoverError(report)
    console.print(f"{name}: checked every node: nothing of the instance is left")


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def status(name: Annotated[str | None, typer.Argument(help="Deployment name (all when left out).")] = None,
           as_json: JsonOpt = False) -> None:  # fmt: skip
    """Per rank: node, state, uptime, health."""
    from sparkfleet.apply.observe import current, degraded_reason
    from sparkfleet.apply.switch import changes
    from sparkfleet.state.deployments import Deployments, controller_gone

    out = [current(rec) for rec in ([Deployments().require(name)] if name else Deployments().all())]
    if as_json:
        typer.echo(json.dumps([
            {"name": rec.name, "status": rec.status, "engine": rec.engine, "endpoint": rec.endpoint,
             "ready_at": rec.ready_at, "restarts": rec.restarts, "instance": rec.instance,
             "controller_gone": controller_gone(rec), "degraded_reason": degraded_reason(rec, ranks),
             "ranks": [r.__dict__ for r in ranks], "changes": changes(rec.name, Deployments())}
            for rec, ranks in out
        ], indent=2))  # fmt: skip
        return
    if not out:
        console.print("no deployments")
    for rec, ranks in out:
        restarts = f"  restarted {rec.restarts}x" if rec.restarts else ""
        state = rec.status
        if controller_gone(rec):  # its up was killed: it will never become ready by itself
            state += f" (its controller is gone: pid {rec.owner_pid}; `sparkfleet down {rec.name}`)"
        shown = table(f"{rec.name}  {state}  {rec.engine}  {rec.endpoint}{restarts}",
                      "rank", "node", "host", "runtime", "state", "uptime", "health", "detail")  # fmt: skip
        for r in ranks:
            style = "green" if r.state == "running" else "red"
            shown.add_row(str(r.rank), r.node, r.host, r.runtime, f"[{style}]{r.state}[/]", _uptime(r.uptime),
                          r.health, r.detail)  # fmt: skip
        console.print(shown)
        why = degraded_reason(rec, ranks)
        if why:
            console.print(f"[red]degraded:[/] {why}", highlight=False, soft_wrap=True)
        for e in changes(rec.name, Deployments()):  # drained, held, released, switched: behind the gateway
            stamp = time.strftime("%H:%M:%S", time.localtime(e["time"]))
            plain(f"  {stamp} {e['kind']}: {e['message']}")


def logs(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    rank: Annotated[int | None, typer.Option("--rank", "-r", help="Only this rank.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines.")] = False,
    tail: Annotated[int, typer.Option("--tail", "-n", help="Lines per rank.")] = 100,
) -> None:
    """Every rank's log, each line prefixed by rank and node."""
    from sparkfleet.apply.observe import follow as follow_logs
    from sparkfleet.apply.observe import logs as read_logs
    from sparkfleet.state.deployments import Deployments

    record = Deployments().require(name)
    if rank is not None and not 0 <= rank < len(record.ranks):
        raise UsageError(f"{name} has ranks 0..{len(record.ranks) - 1}, not {rank}")
    nodes = {r.rank: r.node.name for r in record.ranks}
    if follow:
        lock = threading.Lock()

        def emit(r: int, node: str, line: str) -> None:
            with lock:
                console.print(f"[cyan]r{r} {node}[/] | {line}", markup=True, highlight=False, soft_wrap=True)

        follow_logs(record, emit, rank)
        return
    for r, text in sorted(read_logs(record, rank, tail).items()):
        for line in text.splitlines():
            console.print(f"[cyan]r{r} {nodes[r]}[/] | ", end="", soft_wrap=True)
            console.out(line, highlight=False)


COMMANDS = {"up": up, "down": down, "rollback": rollback, "status": status, "logs": logs}
