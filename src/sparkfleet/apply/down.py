"""``down``: stop a recorded deployment's own instance on every node, then prove it: every node is
checked for anything of the instance still there (the agent's ``leftovers`` rule) and for the
memory still held (MemAvailable before and after, nvidia-smi's compute apps where there is one).
``down --sweep``: find a deployment's ranks by name on a cluster, whoever started them, and stop them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sparkfleet.config.cluster import Node
from sparkfleet.config.sizes import format_size
from sparkfleet.doctor.probes.gpu import APPS_COMMAND, GpuProcess, parse_apps
from sparkfleet.errors import LeftoverError, StateError, StopIncomplete
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.files import remove
from sparkfleet.nodes.identity import FoundRank, controller_owner
from sparkfleet.nodes.inspection import Leftover, NodeAfter, leftovers_on, watch_node
from sparkfleet.nodes.runtime import find_ranks, remove_ranks, runtime_for
from sparkfleet.nodes.transport import Connector, transport_for
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import RankHandle
from sparkfleet.state.deployments import Deployment, Deployments

# A node's clock may be a little behind this one's (NTP keeps them within milliseconds; a few
# seconds is generous): a process started this long before the instance counts as after it.
CLOCK_SLACK_S = 5.0


@dataclass
class Stopped:
    """What was stopped, per rank, and the nodes that failed (with their error)."""

    stopped: list[str] = field(default_factory=list)
    failed: dict[str, BaseException] = field(default_factory=dict)


def stop_ranks(ranks: Sequence[RankHandle], transports: Mapping[str, Transport], deployment: str,
               instance: str | None, *, grace: float = 10.0) -> Stopped:  # fmt: skip
    """Stop ranks wave by wave (the engine's order, ``stop_wave``), a wave on every node in transports
    at once. A node that fails in one wave is reported, and the later waves are still stopped."""
    result = Stopped()
    for wave in sorted({r.stop_wave for r in ranks}):
        members = [r for r in ranks if r.stop_wave == wave and r.node.name in transports]

        def stop(node: str, members: list[RankHandle] = members) -> list[str]:
            out: list[str] = []
            for rank in (r for r in members if r.node.name == node):
                gone = runtime_for(rank).stop(rank, transports[node], deployment, instance, grace)
                out += [f"{node} rank {rank.rank}: {x}" for x in gone]
            return out

        for node, outcome in fan_out(list(dict.fromkeys(r.node.name for r in members)), stop).items():
            if outcome.ok:
                result.stopped += outcome.value or []
            else:
                result.failed.setdefault(node, outcome.error or RuntimeError("failed"))
    return result


@dataclass(frozen=True)
class NodeMemory:
    """What one node holds after down: MemAvailable before and after, and its GPU compute apps
    (None where the node has no nvidia-smi), each with the leftover pid it belongs to, if any."""

    node: str
    before: int | None
    after: int | None
    gpu_apps: tuple[GpuProcess, ...] | None
    gpu_note: str | None = None

    def describe(self, leftover_pids: set[str]) -> str:
        def size(v: int | None) -> str:
            return format_size(v) if v is not None else "?"

        line = f"{self.node}: MemAvailable {size(self.before)} before, {size(self.after)} after"
        if self.before is not None and self.after is not None:
            line += f" ({'+' if self.after >= self.before else '-'}{format_size(abs(self.after - self.before))})"
        if self.gpu_apps is None:
            return line + "; no nvidia-smi" + (f" ({self.gpu_note})" if self.gpu_note not in (None, "no nvidia-smi")
                                               else "")  # fmt: skip
        if not self.gpu_apps:
            return line + "; GPU: no compute apps"
        apps = [f"pid {a.pid} {a.name} {'?' if a.used_mib is None else f'{a.used_mib} MiB'}"
                + (" (left by this instance)" if str(a.pid) in leftover_pids else " (not this instance's)")
                for a in self.gpu_apps]  # fmt: skip
        return line + "; GPU compute apps: " + ", ".join(apps)


@dataclass(frozen=True)
class DownReport:
    """What down stopped, what it found left on each node, and the memory per node."""

    name: str
    stopped: list[str]
    leftovers: list[Leftover] = field(default_factory=list)
    memory: list[NodeMemory] = field(default_factory=list)
    unchecked: dict[str, str] = field(default_factory=dict)  # node -> why it could not be checked
    orphans: list[FoundRank] = field(default_factory=list)  # earlier instances' ranks, stopped too

    def problem(self) -> str | None:
        """One message naming what is left (node and pid), or None when the nodes are clean."""
        parts = [f.describe() for f in self.leftovers]
        parts += [f"{node}: not checked ({why})" for node, why in self.unchecked.items()]
        if not parts:
            return None
        return f"{self.name}: stopped, but not everything of the instance is gone:\n  " + "\n  ".join(parts)


def down(deployment: Deployment, *, deployments: Deployments | None = None, connect: Connector = transport_for,
         hold: bool = False) -> list[str]:  # fmt: skip
    """Stop every rank of a recorded deployment's own instance (idempotent); returns what was
    stopped. LeftoverError (carrying the report) when anything of the instance is left."""
    report = take_down(deployment, deployments=deployments, connect=connect, hold=hold)
    if report.problem():
        raise LeftoverError(report)
    return report.stopped


def take_down(deployment: Deployment, *, deployments: Deployments | None = None, connect: Connector = transport_for,
              hold: bool = False) -> DownReport:  # fmt: skip
    """Stop the instance's ranks, then check every node for what is left and the memory held.
    Behind a gateway, it is drained first (apply/switch.py); ``hold``: it is being replaced, and
    requests for its models wait for the replacement."""
    records = deployments or Deployments()
    if deployment.unreadable:  # an older version's record: nothing in it can be trusted to reach a node
        records.set_status(deployment.name, "stopped")  # the name is free again; the record stays for history
        raise StateError(f"{deployment.name}: its record cannot be read by this version ({deployment.unreadable}); "
                         f"marked stopped. If its ranks still run, `sparkfleet down {deployment.name} --sweep "
                         "--cluster FILE` finds and stops them")  # fmt: skip
    if deployment.status in ("ready", "degraded", "draining"):
        from sparkfleet.apply.switch import drain

        drain(deployment, records, hold=hold)
    transports = {r.node.name: connect(r.node) for r in deployment.ranks}
    nodes = {r.node.name: r.node for r in deployment.ranks}
    # MemAvailable before anything stops: a watch of no ranks is that alone.
    before = fan_out(list(transports), lambda n: watch_node(transports[n], nodes[n], []).mem_available)
    records.set_status(deployment.name, "stopping")
    result = stop_ranks(deployment.ranks, transports, deployment.name, deployment.instance)
    if result.failed:
        failed = {n: str(e) for n, e in result.failed.items()}
        records.event(deployment.name, "down-failed", "; ".join(f"{n}: {e}" for n, e in failed.items()))
        raise StopIncomplete(f"{deployment.name}: could not stop every rank: ", failed)
    _remove_env_files(deployment, transports)
    orphans = _stop_other_instances(deployment, transports)
    report = _check_nodes(deployment, transports, before.succeeded, result.stopped, orphans)
    problem = report.problem()
    if problem:
        records.set_status(deployment.name, "leftover")
        records.event(deployment.name, "down-leftover", problem)
    else:
        records.set_status(deployment.name, "stopped")
        records.event(deployment.name, "down", f"stopped {len(report.stopped)} container(s)/process(es); nothing left")
    return report


def _remove_env_files(deployment: Deployment, transports: dict[str, Transport]) -> None:
    """The ranks' env files hold every secret they were started with: gone once the ranks are
    (the node agent's stop removes a process rank's; a container's is removed here)."""
    docker = [r for r in deployment.ranks if r.runtime == "docker"]
    files = {n: [r.env_file for r in docker if r.node.name == n] for n in {r.node.name for r in docker}}
    fan_out(list(files), lambda n: remove(transports[n], *files[n]))


def _stop_other_instances(deployment: Deployment, transports: dict[str, Transport]) -> list[FoundRank]:
    """Stop the running ranks of deployment's name on its nodes that this controller started
    under another instance than the recorded one: an ``up`` killed before it could roll back,
    whose record was replaced since, leaves ranks only their markers name. Another owner's are
    left to ``down --sweep``; the node agent re-checks each pid's markers before it stops one."""
    nodes: dict[str, Node] = {r.node.name: r.node for r in deployment.ranks}
    containers = any(r.runtime == "docker" for r in deployment.ranks)
    me = controller_owner()

    def look(name: str) -> list[FoundRank]:
        found = find_ranks(transports[name], deployment.name, nodes[name], containers=containers)
        return [f for f in found if f.owner == me and f.instance != deployment.instance and f.running]

    # A node that cannot be reached is named by down's own check of the recorded instance.
    found = [f for o in fan_out(list(nodes), look).values() if o.ok and o.value for f in o.value]
    sweep(found, nodes, lambda node: transports[node.name])
    return found


def _check_nodes(deployment: Deployment, transports: dict[str, Transport], before: dict[str, int | None],
                 stopped: list[str], orphans: list[FoundRank]) -> DownReport:  # fmt: skip
    since = deployment.created - CLOCK_SLACK_S if deployment.instance else None

    def check(node_name: str) -> NodeAfter:
        ranks = [r for r in deployment.ranks if r.node.name == node_name]
        return leftovers_on(transports[node_name], ranks[0].node, deployment.name, deployment.instance, since, ranks,
                            APPS_COMMAND)  # fmt: skip

    report = DownReport(deployment.name, stopped, orphans=orphans)
    for node, outcome in fan_out(list(transports), check).items():
        if not outcome.ok or outcome.value is None:
            report.unchecked[node] = str(outcome.error)
            continue
        after = outcome.value
        report.leftovers.extend(after.leftovers)
        apps = parse_apps(after.gpu_apps_csv) if after.gpu_apps_csv is not None else None
        report.memory.append(NodeMemory(node, before.get(node), after.mem_available, apps, after.gpu_error))
    return report


def find_by_name(nodes: Mapping[str, Node], name: str) -> list[FoundRank]:
    """Every rank of any instance of deployment name on every node (by name), with its owner
    (what ``down --sweep`` lists before it stops anything)."""
    found = fan_out(list(nodes), lambda n: find_ranks(transport_for(nodes[n]), name, nodes[n])).raise_first()
    return [f for ranks in found.values() for f in ranks]


def sweep(found: list[FoundRank], nodes: Mapping[str, Node], connect: Connector = transport_for) -> None:
    """Stop the ranks found (by find_by_name, whoever started them, or by down's own look), node by node."""
    mine = {n: [f for f in found if f.node == n] for n in sorted({f.node for f in found})}
    fan_out(list(mine), lambda n: remove_ranks(connect(nodes[n]), mine[n], nodes[n])).raise_first()
