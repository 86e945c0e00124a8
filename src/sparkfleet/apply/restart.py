"""The restart policy (``[serve] restart = "on-failure"``): a multi-node engine cannot lose one
rank, so a rank's death takes the whole deployment down and brings the stored Plan up again;
every step is an event, and after ``max_restarts`` it gives up, saying so. The stored Plan has no
secret values: they are read back from each rank's env file on its node, so a restart needs
nothing from the user's shell. The dashboard's restart button is ``restart``: once, no policy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from sparkfleet.apply.configurations import spec_of_instance
from sparkfleet.apply.down import down, take_down
from sparkfleet.apply.observe import rank_secrets
from sparkfleet.apply.switch import release
from sparkfleet.apply.up import UpResult, up
from sparkfleet.errors import NotFoundError, SparkfleetError
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.transport import Connector, transport_for
from sparkfleet.plan.model import Plan
from sparkfleet.state.deployments import Deployment, Deployments
from sparkfleet.state.plans import masked_keys, with_secrets

MAX_BACKOFF_S = 600.0
# Called with (event kind, message, node or None) for every step.
Emit = Callable[[str, str, str | None], None]


@dataclass(frozen=True)
class Outcome:
    """How a recovery ended: ready again (restarts counts it) or given up."""

    ready: bool
    restarts: int
    message: str


def _secret_files(plan: Plan, connect: Connector) -> dict[int, dict[str, str] | None]:
    """Each rank's secret env values as its node holds them (only for ranks that need them)."""
    needing = {str(r.rank): r for r in plan.ranks if masked_keys(r)}
    read = fan_out(list(needing), lambda k: rank_secrets(needing[k].handle, connect(needing[k].node)) or None)
    return {int(k): o.value if o.ok else None for k, o in read.items()}


def _up_again(record: Deployment, stored: Plan, secrets: dict[int, dict[str, str] | None], records: Deployments,
              connect: Connector) -> UpResult:  # fmt: skip
    """Bring the stored Plan up again, recorded as the configuration its instance was."""
    config = spec_of_instance(record.name, record.instance, records.store)
    return up(with_secrets(stored, secrets), config=config, deployments=records, connect=connect)


def restart(record: Deployment, *, records: Deployments, connect: Connector = transport_for) -> UpResult:
    """Take record down and bring its stored Plan up again, once (the dashboard's restart)."""
    stored = records.stored_plan(record.name)
    if stored is None:
        raise NotFoundError(f"cannot restart {record.name}: its record predates stored plans; bring it up "
                            "again with `up`")  # fmt: skip
    secrets = _secret_files(stored, connect)  # before anything is stopped: the env files are the only copy
    down(record, deployments=records, connect=connect)
    return _up_again(record, stored, secrets, records, connect)


def recover(record: Deployment, why: str, *, records: Deployments, connect: Connector, emit: Emit,
            stop: threading.Event) -> Outcome:  # fmt: skip
    """Take record down and bring its stored Plan up again, retrying with backoff until it is
    ready or max_restarts restarts were made; stop (set by Ctrl-C/SIGTERM) ends the waiting."""
    stored = records.stored_plan(record.name)
    if stored is None:
        message = f"cannot restart {record.name}: its record predates stored plans; bring it up again with `up`"
        emit("gave-up", message, None)
        return Outcome(False, record.restarts, message)
    policy, done = stored.serve, record.restarts
    # Secrets are read before anything is stopped: the env files are the only copy.
    try:
        secrets = _secret_files(stored, connect)
    except SparkfleetError as exc:
        secrets, why = {}, f"{why}; {exc.message}"
    while True:
        if done >= policy.max_restarts:
            message = (f"gave up on {record.name}: {why}; {done} restart(s) made, max_restarts = {policy.max_restarts}"
                       "; it stays down")  # fmt: skip
            emit("gave-up", message, None)
            current = records.get(record.name)
            if current is not None and current.status not in ("stopped", "leftover"):
                take_down(current, deployments=records, connect=connect)
            records.set_status(record.name, "failed")
            records.set_restarts(record.name, done)
            release(record.name, records)  # behind a gateway, the requests held meanwhile go on
            return Outcome(False, done, message)
        delay = float(min(policy.backoff * (2**done), MAX_BACKOFF_S))  # doubled per restart made
        emit("restart", f"restart {done + 1}/{policy.max_restarts} of {record.name} in {delay:.0f}s: {why}", None)
        if stop.wait(delay):
            return Outcome(False, done, "watch was stopped before the restart")
        current = records.get(record.name) or record
        report = take_down(current, deployments=records, connect=connect, hold=True)
        left = report.problem()
        emit("restart-down", f"took {record.name} down: {len(report.stopped)} container(s)/process(es) stopped"
             + (f"; {left}" if left else "; nothing left"), None)  # fmt: skip
        done += 1
        try:
            result = _up_again(current, stored, secrets, records, connect)
        except SparkfleetError as exc:
            why = exc.message.splitlines()[0]
            emit("restart-failed", f"restart {done}/{policy.max_restarts} of {record.name} failed: {exc.message}", None)
            continue
        finally:
            records.set_restarts(record.name, done)  # however the attempt ended, Ctrl-C included
        message = (f"restart {done}/{policy.max_restarts}: {record.name} ready again at {result.endpoint} "
                   f"in {result.seconds:.1f}s")  # fmt: skip
        emit("restarted", message, None)
        release(record.name, records)
        return Outcome(True, done, message)
