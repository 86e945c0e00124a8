"""``watch NAME``: poll a deployment in the foreground (and restart it by its [serve] policy)."""

from __future__ import annotations

from typing import Annotated

import typer

from sparkfleet.cli.console import console, plain
from sparkfleet.errors import UsageError


def watch(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    interval: Annotated[
        float,
        typer.Option(
            help="Seconds between polls (at least 1; 10 keeps the cost to the engine negligible, see docs/watch.md)."
        ),
    ] = 10.0,
    count: Annotated[int | None, typer.Option(help="Stop after this many polls (default: until Ctrl-C).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print events only, not a line per poll.")] = False,
) -> None:
    """Poll every rank, rank 0's health and /metrics, each node's MemAvailable; record the series
    and events; with [serve] restart = "on-failure", bring the deployment back after a rank dies.
    Ends when the deployment is taken down (exit 0) or the restart policy gives up (exit 1)."""
    from sparkfleet.apply.up import sigterm_interrupts
    from sparkfleet.apply.watch import MIN_INTERVAL_S, Event, Poll, Watcher

    if interval < MIN_INTERVAL_S:
        raise UsageError(f"watch --interval {interval:g}: must be at least {MIN_INTERVAL_S:g} second(s)")

    def show_event(event: Event) -> None:
        style = "green" if event.kind in ("restarted", "health-back", "mem-ok", "node-back") else "red"
        console.print(f"[{style}]{event.kind}[/] {event.message}", markup=True, highlight=False, soft_wrap=True)

    def show_poll(poll: Poll) -> None:
        if not quiet:
            plain(poll.line())

    watcher = Watcher(name, interval=interval, on_event=show_event)
    try:
        with sigterm_interrupts():  # systemd stops the unit with SIGTERM: end the way Ctrl-C does
            code = watcher.run(count=count, on_poll=show_poll)
    except KeyboardInterrupt:
        console.print(f"{name}: watch stopped; the deployment keeps running")
        return
    if code == 0 and count is None:
        console.print(f"{name}: taken down; watch ends")
    if code:
        raise typer.Exit(code)


COMMANDS = {"watch": watch}
