"""Changes without dropping requests (issue 34): drain a deployment behind the gateway before its
ranks stop, hold its requests while it is replaced, and ``switch`` OLD for NEW.

``drain`` and ``release`` are the hooks ``down``, ``rollback``, ``ab`` and watch's restarts call;
they reach every gateway of this state dir through its admin endpoint (gateway/control.py) and
write what happened to the deployment's timeline (``drained``, ``held``, ``released``), which
``status`` and the dashboard show. With no gateway running they do nothing.

``switch``: where NEW can run beside OLD (``side_by_side``: another name, no port of OLD's on a
shared node, and the memory plan of both within the node's memory where it knows it), NEW comes up,
joins OLD's route, and OLD is drained and stopped: traffic moves with no wait. Otherwise OLD is
drained (new requests held), stopped, NEW comes up, and the held requests go to it; if NEW fails,
OLD's stored Plan is brought back so the held requests still get an answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkfleet.config.sizes import format_size
from sparkfleet.errors import NotFoundError, SparkfleetError, StateError
from sparkfleet.plan.model import Plan
from sparkfleet.state.deployments import Deployment, Deployments

if TYPE_CHECKING:
    from sparkfleet.apply.configurations import ConfigSpec
    from sparkfleet.apply.up import UpResult

Say = Callable[[str], None]
# The timeline's events of a change behind the gateway (status and the dashboard show them).
CHANGE_EVENTS = ("drained", "held", "released", "switched")


def changes(name: str, records: Deployments, limit: int = 4) -> list[dict[str, Any]]:
    """The latest change events of deployment name, oldest first."""
    return [e for e in records.events(name, limit=200) if e["kind"] in CHANGE_EVENTS][-limit:]


def _state(records: Deployments) -> Any:
    return records.store.path.parent


def drain(record: Deployment, records: Deployments, *, hold: bool, grace: float | None = None) -> bool:
    """Tell every gateway to send record no new request and wait for its in-flight ones (then
    cancel what is left after grace); ``hold``: requests for its models wait while it is away.
    False when no gateway answered."""
    from sparkfleet.gateway import control

    answers = control.drain(record.name, hold=hold, grace=grace, state=_state(records))
    if not answers:
        return False
    finished = sum(int(a.get("finished", 0)) for a in answers)
    cancelled = sum(int(a.get("cancelled", 0)) for a in answers)
    moved = sum(int(a.get("moved", 0)) for a in answers)
    seconds = max(float(a.get("seconds", 0.0)) for a in answers)
    message = (f"drained behind {len(answers)} gateway(s) in {seconds:.1f}s: {finished} in-flight request(s) "
               f"finished, {moved} not yet begun sent again elsewhere, {cancelled} cut off")  # fmt: skip
    if hold:
        message += "; new requests held until it is back"
    records.event(record.name, "drained", message)
    return True


@dataclass(frozen=True)
class Released:
    held: int
    released: int
    rejected: int
    longest: float

    def describe(self) -> str:
        return (f"{self.held} request(s) held (longest {self.longest:.1f}s), {self.released} released in arrival "
                f"order, {self.rejected} turned away")  # fmt: skip


def release(name: str, records: Deployments) -> Released | None:
    """Every gateway re-reads the state store and lets go of what it held for name; the ``held``
    and ``released`` events (counted since name's last drain). None: no gateway, or no drain."""
    from sparkfleet.gateway import control

    drains = [e for e in records.events(name, limit=200) if e["kind"] == "drained"]
    if not drains:
        return None
    answers = control.release(name, float(drains[-1]["time"]) - 1.0, state=_state(records))
    if not answers:
        return None
    out = Released(sum(int(a.get("held", 0)) for a in answers), sum(int(a.get("released", 0)) for a in answers),
                   sum(int(a.get("rejected", 0)) for a in answers),
                   max(float(a.get("longest", 0.0)) for a in answers))  # fmt: skip
    if out.held:
        records.event(name, "held", f"held {out.held} request(s) while it had no ready replica "
                      f"(longest wait {out.longest:.1f}s)")  # fmt: skip
    records.event(name, "released", f"released {out.released} held request(s) in arrival order"
                  + (f"; {out.rejected} turned away past the hold limits" if out.rejected else ""))  # fmt: skip
    return out


def side_by_side(old: Plan, new: Plan) -> tuple[bool, str]:
    """Whether NEW can run while OLD does, and why (or why not)."""
    if old.name == new.name:
        return False, f"both are named {new.name!r}: one record, one set of ports"
    taken = {(r.node.host, p) for r in old.ranks for p in (*r.ports, *([old.port] if r.rank == 0 else []))}
    for r in new.ranks:
        for p in (*r.ports, *([new.port] if r.rank == 0 else [])):
            if (r.node.host, p) in taken:
                return False, f"port {p} on {r.node.name} is {old.name}'s"
    from sparkfleet.plan.memory import memory_plan

    shared = {r.node.host for r in old.ranks} & {r.node.host for r in new.ranks}
    for host in sorted(shared):
        ranks = [(old, r) for r in old.ranks if r.node.host == host] + [(new, r) for r in new.ranks
                                                                        if r.node.host == host]  # fmt: skip
        gpu = [(p, r) for p, r in ranks if r.node.gpus != "none"]
        if not gpu:
            continue
        needs = [memory_plan(r, p.memory) for p, r in gpu]
        device = next((m.device_memory for m in needs if m.device_memory), None)
        total = [m.total_need for m in needs]
        if device is None or any(t is None for t in total):
            return False, f"the memory plan cannot tell whether both fit on {gpu[0][1].node.name} (figures unknown)"
        need = sum(t for t in total if t is not None)
        if need > device:
            return False, (f"the memory plan needs {format_size(need)} on {gpu[0][1].node.name} for both, "
                           f"{format_size(device)} is there")  # fmt: skip
    return True, "another name, no shared port, and the memory plan fits both"


@dataclass(frozen=True)
class SwitchResult:
    way: str  # "side by side" or "one after the other"
    why: str
    result: UpResult
    released: Released | None


def switch(old_name: str, spec: ConfigSpec, records: Deployments | None = None, say: Say = lambda _m: None,
           timeout: float | None = None) -> SwitchResult:  # fmt: skip
    """Replace deployment old_name by what spec plans, losing no request behind the gateway."""
    from sparkfleet.apply.down import take_down
    from sparkfleet.apply.up import up

    records = records or Deployments()
    old = records.get(old_name)
    if old is None or old.status in ("stopped", "failed"):
        raise NotFoundError(f"no running deployment named {old_name!r} to switch from (see `sparkfleet status`)")
    new = spec.plan()  # before anything changes: a NEW that cannot plan changes nothing
    stored = records.stored_plan(old_name)
    if new.name != old_name and (other := records.get(new.name)) is not None and other.status in ("ready", "starting"):
        raise StateError(f"{new.name} is already {other.status}: name the new deployment with --name")
    together, why = side_by_side(stored, new) if stored is not None else (False, f"{old_name} has no stored plan")
    start = time.monotonic()
    if together:
        say(f"{new.name} can run beside {old_name} ({why}): up beside it, then traffic moves, then {old_name} stops")
        result = up(new, config=spec, deployments=records, timeout=timeout)
        _joined(new.name, records)
        take_down(old, deployments=records, hold=False)
        _switched(old_name, new.name, records, say, f"side by side in {time.monotonic() - start:.1f}s: "
                  f"{new.name} joined the route before {old_name} was drained")  # fmt: skip
        return SwitchResult("side by side", why, result, None)
    say(f"{new.name} cannot run beside {old_name} ({why}): drain, down, up, then release the held requests")
    take_down(old, deployments=records, hold=True)
    try:
        result = up(new, config=spec, deployments=records, timeout=timeout)
    except (SparkfleetError, KeyboardInterrupt) as exc:
        say(f"{new.name} did not come up ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
            f"bringing {old_name} back")  # fmt: skip
        _bring_back(old_name, records, say)
        raise
    finally:
        released = release(old_name, records)
    _switched(old_name, new.name, records, say, f"one after the other in {time.monotonic() - start:.1f}s"
              + (f"; {released.describe()}" if released else ""))  # fmt: skip
    return SwitchResult("one after the other", why, result, released)


def _switched(old_name: str, new_name: str, records: Deployments, say: Say, how: str) -> None:
    message = f"switched {old_name} -> {new_name} {how}"
    for name in dict.fromkeys((old_name, new_name)):  # one event when the name stays
        records.event(name, "switched", message)
    say(message)


def _joined(name: str, records: Deployments) -> None:
    """Make every gateway read the state store now, so NEW takes requests before OLD drains."""
    from sparkfleet.gateway import control

    control.release(name, time.time(), state=_state(records))


def _bring_back(name: str, records: Deployments, say: Say) -> None:
    from sparkfleet.apply.restart import restart

    record = records.get(name)
    if record is None:
        return
    try:
        back = restart(record, records=records)
        say(f"{name} is back at {back.endpoint}")
    except SparkfleetError as exc:
        say(f"{name} could not be brought back either: {exc.message}")
