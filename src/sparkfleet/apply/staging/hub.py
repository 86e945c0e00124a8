"""The Hub fetch, controller side: the engine's files of the recipe's model onto the source node,
once, by nodes/shipped/hub_fetch.py with that node's python (huggingface_hub's own client: resume,
cache layout, auth). The token travels on stdin, never in argv; the Hub address is the controller's
``HF_ENDPOINT`` when set (a mirror). The other nodes get the snapshot from that node, not the Hub.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from sparkfleet.apply.staging.base import Context, Runner
from sparkfleet.config.secrets import redact
from sparkfleet.errors import StagingError
from sparkfleet.nodes.ship import HUB_FETCH, stream_shipped
from sparkfleet.nodes.shipped.hub_fetch import rules
from sparkfleet.plan.staging import StagingStep
from sparkfleet.plan.staging.hub import Hub

TOKEN_KEYS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


@dataclass(frozen=True)
class HubReport:
    """What one fetch did on the source node."""

    node: str
    repo: str
    commit: str
    fetched: tuple[tuple[str, int], ...]  # (file, size) downloaded (or finished) this run
    present: tuple[str, ...]  # already in the node's cache
    skipped: tuple[tuple[str, int, str], ...]  # (file, size, why) never fetched
    bytes_fetched: int  # what came from the Hub this run (a resumed file counts its rest only)
    asked_hub: bool  # False: a pinned snapshot already complete, no request made
    seconds: float
    note: str | None = None  # e.g. the Hub did not answer and the cache's complete copy was used

    @property
    def bytes_skipped(self) -> int:
        return sum(size for _, size, _ in self.skipped)


def run(ctx: Context, steps: Sequence[StagingStep]) -> list[HubReport]:
    """Bring the step's model to its node; the token (the plan's HF_TOKEN) travels on stdin."""
    (step,) = steps
    spec, plan = step.entry, ctx.plan
    assert isinstance(spec, Hub) and plan is not None
    ctx.say(f"fetching {spec.repo} from the Hub onto {step.node} (only what the engine loads)")
    env = plan.head.env_dict()
    token = next((env[k] for k in TOKEN_KEYS if env.get(k)), None)
    job = {"repo": spec.repo, "revision": spec.revision, "cache": spec.dst, "profile": list(spec.profile),
           "endpoint": os.environ.get("HF_ENDPOINT"), "token": token}  # fmt: skip
    transport, python = ctx.transport(step.node), ctx.python(step.node)
    stream = stream_shipped(transport, python, HUB_FETCH, (json.dumps(job) + "\n").encode())
    last = ""
    for line in stream:
        line = line.strip()
        if line.startswith("P ") and ctx.progress is not None:
            done, total = line.split()[1:3]
            ctx.progress(step, int(done), int(total))
        elif line:
            last = line
    code = stream.wait()
    secrets = {"HF_TOKEN": token} if token else {}
    try:
        out = json.loads(last)
    except ValueError:
        tail = redact(stream.errors().strip()[-800:] or last, secrets)
        raise StagingError(step.node, f"fetching {spec.repo} from the Hub failed (exit {code}): {tail}") from None
    if out.get("error"):
        raise StagingError(step.node, f"fetching {spec.repo} from the Hub: {redact(str(out['error']), secrets)}")
    report = HubReport(
        node=step.node, repo=spec.repo, commit=out["commit"],
        fetched=tuple((n, int(s)) for n, s in out["fetched"]), present=tuple(out["present"]),
        skipped=tuple((n, int(s), why) for n, s, why in out["skipped"]), bytes_fetched=int(out["bytes"]),
        asked_hub=bool(out["asked_hub"]), seconds=float(out.get("seconds", 0.0)),
        note=redact(out["note"], secrets) if out.get("note") else None,
    )  # fmt: skip
    if report.note:
        ctx.note(step.node, report.note)
    ctx.say(f"from the Hub: {report.bytes_fetched:,} bytes; {len(report.skipped)} file(s) not fetched "
            f"({report.bytes_skipped:,} bytes)")  # fmt: skip
    return [report]


RUNNER = Runner(Hub, "fetch", run)


def print_rules(step: StagingStep, console: Console) -> None:
    """What ``plan`` shows of the fetch before the listing is known: its rules, with why."""
    spec = step.entry
    assert isinstance(spec, Hub)
    table = Table(title=f"from the Hub: {spec.repo}@{spec.revision or 'main'} onto {step.node} ({spec.dst}), "
                  "unless already there", title_justify="left")  # fmt: skip
    for col in ("files", "", "why"):
        table.add_column(col)
    for files, action, why in rules(spec.profile):
        table.add_row(files, action, why)
    console.print(table)
