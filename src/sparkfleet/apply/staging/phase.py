"""The staging phase, one for ``up`` and ``sparkfleet stage``: the distribution steps (sync,
copy, nfs) first, since composed model directories link into what they put in place, then the
steps that run on each node (sparse-rows, composed). With ``verify`` nothing is written: only the
node-side steps check what they staged, in full."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sparkfleet.apply import hub
from sparkfleet.apply.distribute import Fanout, distribute
from sparkfleet.apply.staging.runner import ProgressFn, StageReport, stage_all
from sparkfleet.errors import StagingError
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import Plan, StagingStep

NODE_STAGED_KINDS = ("sparse-rows", "composed")
DISTRIBUTED_KINDS = ("sync", "copy", "nfs")


@dataclass(frozen=True)
class StagePhase:
    """What the staging phase did: distribution's notes and each node-side step's report."""

    verify: bool
    notes: list[str] = field(default_factory=list)
    reports: list[StageReport] = field(default_factory=list)
    fetched: hub.HubReport | None = None  # what came from the Hub onto the source node
    bytes_between_nodes: int = 0

    def rows(self) -> list[dict[str, object]]:
        """One row per staged file or composed directory, by step and rank."""
        rows: list[dict[str, object]] = []
        for rep in sorted(self.reports, key=lambda r: (r.step_id, r.rank)):
            for out in rep.outputs:
                rows.append({"node": rep.node, "rank": rep.rank, "step": rep.step_id, "path": out.path,
                             "status": out.status, "action": out.action, "bytes_written": out.bytes_written,
                             "chunks_rewritten": out.chunks_rewritten, "chunks_total": out.chunks_total})  # fmt: skip
            if rep.composed is not None:
                c = rep.composed
                rows.append({"node": rep.node, "rank": rep.rank, "step": rep.step_id, "path": c.model_dir,
                             "status": "; ".join(c.problems) or "ok",
                             "action": "verified" if self.verify else "composed", "bytes_written": 0,
                             "links": c.links, "hard_links": c.hard_links,
                             "extra_mounts": list(c.extra_mounts)})  # fmt: skip
        return rows

    def check(self) -> None:
        """StagingError naming the first file that is not as staged (what --verify judges)."""
        bad = [r for r in self.rows() if r["status"] != "ok"]
        if bad:
            first = bad[0]
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise StagingError(str(first["node"]), f"{first['path']} is not as staged: {first['status']}{more}")


def stage(plan: Plan, transports: Mapping[str, Transport], *, verify: bool = False,
          progress: ProgressFn | None = None, say: Callable[[str], None] = lambda _m: None,
          fanout: Fanout = "pipeline") -> StagePhase:  # fmt: skip
    """Run the plan's staging (see the module's doc); StagingError on the first step that fails.
    The Hub fetch onto the source node (plan.fetch) comes first, then distribution from there."""
    notes: list[str] = []
    fetched = None
    between = 0
    if not verify and plan.fetch is not None:
        spec = plan.fetch
        say(f"fetching {spec.repo} from the Hub onto {spec.node} (only what the engine loads)")
        bar = StagingStep("hub", "hub", 0, spec.node, None, spec.cache, 1, 0)
        fetched = hub.fetch(plan, transports, None if progress is None else lambda d, t: progress(bar, d, t))
        if fetched is not None and fetched.note:
            notes.append(f"{spec.node}: {fetched.note}")
            say(fetched.note)
        if fetched is not None:
            say(f"from the Hub: {fetched.bytes_fetched:,} bytes; {len(fetched.skipped)} file(s) not fetched "
                f"({fetched.bytes_skipped:,} bytes)")  # fmt: skip
    if not verify and any(s.kind in DISTRIBUTED_KINDS for s in plan.staging):
        say("distributing model files")
        done = distribute(plan, transports, progress, fanout=fanout)
        notes += done.notes
        between = done.bytes_sent
        for note in done.notes:
            say(note)
    steps = [s for s in plan.staging if s.kind in NODE_STAGED_KINDS]
    reports: list[StageReport] = []
    if steps:
        say(f"{'verifying' if verify else 'staging'} {len(steps)} step(s)")
        pythons = {r.node.name: r.node.python for r in plan.ranks}
        reports = stage_all(steps, dict(transports), verify=verify, progress=progress, pythons=pythons)
    return StagePhase(verify, notes, reports, fetched, between)
