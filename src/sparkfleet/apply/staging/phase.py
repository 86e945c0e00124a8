"""The staging phase, one for ``up`` and ``sparkfleet stage``: the Hub fetch, then distribution
between nodes (each entry on all its nodes at once, in recipe order), since composed directories
link into what it puts in place, then what runs on each node (nodes in parallel; on each, one
kind's steps at once). With ``verify`` only the kinds that run on the node check, in full."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from rich import progress as rp
from rich.console import Console

from sparkfleet.apply.staging import RUNNERS
from sparkfleet.apply.staging.base import Context, Fanout, Method, Phase, ProgressFn, StageReport
from sparkfleet.errors import StagingError
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import Plan
from sparkfleet.plan.staging import StagingStep

T = TypeVar("T")


@dataclass(frozen=True)
class StagePhase:
    """Every report of the phase, in the order the steps ran."""

    verify: bool
    reports: tuple[Any, ...] = ()
    notes: tuple[str, ...] = ()  # what the user was told (e.g. rsync missing on a node: a tar stream was used)

    def of(self, kind: type[T]) -> list[T]:
        """The reports of one type (e.g. ``SyncReport``)."""
        return [r for r in self.reports if isinstance(r, kind)]

    @property
    def bytes_between_nodes(self) -> int:
        """What distribution moved onto the nodes."""
        return sum(getattr(r, "bytes_sent", 0) for r in self.reports)

    def rows(self) -> list[dict[str, object]]:
        """One row per staged file or composed directory, by step and rank."""
        reports = sorted(self.of(StageReport), key=lambda r: (r.step_id, r.rank))
        return [row for r in reports for row in r.rows(self.verify)]

    def check(self) -> None:
        """StagingError naming the first file that is not as staged (what --verify judges)."""
        bad = [r for r in self.rows() if r["status"] != "ok"]
        if bad:
            first = bad[0]
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise StagingError(str(first["node"]), f"{first['path']} is not as staged: {first['status']}{more}")


def _by(ctx: Context, steps: Sequence[StagingStep], key: Callable[[StagingStep], object]) -> list[Any]:
    """Run the steps grouped by key, a group at a time, each by its kind's runner."""
    groups: dict[object, list[StagingStep]] = {}
    for step in steps:
        groups.setdefault(key(step), []).append(step)
    return [r for group in groups.values() for r in RUNNERS[type(group[0].entry)].stage(ctx, group)]


def _runs(ctx: Context, steps: Sequence[StagingStep], phase: Phase) -> list[Any]:
    """One phase's steps: per entry on all its nodes, or, for ``node``, per node and kind."""
    steps = [s for s in steps if RUNNERS[type(s.entry)].phase == phase]
    if phase != "node":
        return _by(ctx, steps, lambda s: s.id)
    nodes = list(dict.fromkeys(s.node for s in steps))
    for node in nodes:
        ctx.transport(node)  # a node without a transport is refused before any starts
    mine = {n: [s for s in steps if s.node == n] for n in nodes}
    done = fan_out(nodes, lambda n: _by(ctx, mine[n], lambda s: type(s.entry)), workers=max(1, len(nodes)))
    return [r for reports in done.raise_all(StagingError).values() for r in reports]


def stage(plan: Plan, transports: Mapping[str, Transport], *, verify: bool = False,
          progress: ProgressFn | None = None, say: Callable[[str], None] = lambda _m: None,
          fanout: Fanout = "pipeline", method: Method = "auto") -> StagePhase:  # fmt: skip
    """Run the plan's staging (see the module's doc); StagingError on the first step that fails."""
    ctx = Context(transports, plan, verify=verify, progress=progress, say=say, fanout=fanout, method=method)
    reports = [] if verify else _runs(ctx, plan.staging, "fetch")
    if not verify and any(RUNNERS[type(s.entry)].phase == "distribute" for s in plan.staging):
        say("distributing model files")
        reports += _runs(ctx, plan.staging, "distribute")
    on_nodes = sum(RUNNERS[type(s.entry)].phase == "node" for s in plan.staging)
    if on_nodes:
        say(f"{'verifying' if verify else 'staging'} {on_nodes} step(s)")
        reports += _runs(ctx, plan.staging, "node")
    return StagePhase(verify, tuple(reports), tuple(ctx.notes))


def distribute(plan: Plan, transports: Mapping[str, Transport], progress: ProgressFn | None = None, *,
               method: Method = "auto", fanout: Fanout = "pipeline") -> StagePhase:  # fmt: skip
    """Only distribution: every sync, copy and nfs entry of the plan (recipe order; nodes in
    parallel within one), without the Hub fetch or what runs on each node."""
    ctx = Context(transports, plan, progress=progress, method=method, fanout=fanout)
    return StagePhase(False, tuple(_runs(ctx, plan.staging, "distribute")), tuple(ctx.notes))


def stage_all(steps: Sequence[StagingStep], transports: Mapping[str, Transport], *, verify: bool = False,
              progress: ProgressFn | None = None, chunk_bytes: int | None = None,
              pythons: Mapping[str, str] | None = None) -> list[StageReport]:  # fmt: skip
    """Run steps of the kinds that run on the node, without a plan: nodes in parallel, errors
    raised once all have finished, naming every node that failed."""
    ctx = Context(transports, verify=verify, progress=progress, chunk_bytes=chunk_bytes, pythons=pythons or {})
    return _runs(ctx, steps, "node")


@contextmanager
def rich_progress(console: Console) -> Iterator[ProgressFn]:
    """One transfer bar per (step, node) on console while the block runs; yields the callback."""
    columns = (rp.BarColumn(), rp.DownloadColumn(), rp.TransferSpeedColumn(), rp.TimeRemainingColumn())
    bars = rp.Progress(rp.TextColumn("{task.description}"), *columns, console=console, transient=False)
    tasks: dict[tuple[str, str], rp.TaskID] = {}

    def update(step: StagingStep, done: int, total: int) -> None:
        key = (step.id, step.node)
        if key not in tasks:
            tasks[key] = bars.add_task(f"{step.id} → {step.node}", total=total)
        bars.update(tasks[key], completed=min(done, total), total=total)

    with bars:
        yield update
