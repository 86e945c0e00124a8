"""``watch``: poll a deployment in the foreground while it serves, record a bounded time series,
and turn what changes into events (and, with ``[serve] restart = "on-failure"``, restarts).

Per poll: one node-agent call per node (every rank's state, and the node's MemAvailable), rank 0's
health, and the engine's Prometheus ``/metrics`` (the bench's parser and metric names). No
nvidia-smi: on a GB10 MemAvailable is the device budget, and polling nvidia-smi on every node costs
the engine decode time (the seeds measured ~0.6 ms per decode step at a 2 s poll).

Events: ``rank-exited`` (code, when, last log lines), ``node-unreachable``/``node-back``,
``health-lost``/``health-back``, ``mem-low``/``mem-ok`` (``[serve] mem_floor``), ``foreign-requests``
(more requests running than a bench of this deployment sends), and the restart policy's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

import httpx

from sparkfleet.apply.observe import exit_detail, rank0_health, rank_log
from sparkfleet.apply.readiness import tail
from sparkfleet.apply.restart import Outcome, recover
from sparkfleet.bench import server_metrics as sm
from sparkfleet.bench.store import BenchStore
from sparkfleet.config.cluster import Node
from sparkfleet.config.sizes import format_size
from sparkfleet.errors import SparkfleetError
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.inspection import NodeWatch, watch_node
from sparkfleet.nodes.runtime.base import RankState
from sparkfleet.nodes.transport import Connector, transport_for
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import RankHandle, ServeSpec
from sparkfleet.state.deployments import Deployment, Deployments
from sparkfleet.state.store import Store
from sparkfleet.state.watch_series import Sample, WatchSeries

MIN_INTERVAL_S = 1.0
DEFAULT_INTERVAL_S = 10.0
LOG_LINES = 20
# A bench run recorded as running longer ago than this was interrupted without finishing.
BENCH_STALE_S = 24 * 3600.0


@dataclass(frozen=True)
class Event:
    """One line of the timeline as watch records and prints it."""

    time: float
    kind: str
    message: str
    node: str | None = None


@dataclass(frozen=True)
class Metrics:
    """What the engine's /metrics said at one poll (None: not exported)."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    spec_accept: float | None = None


@dataclass(frozen=True)
class Poll:
    """One poll's findings."""

    time: float
    status: str  # the deployment record's status after the poll
    nodes: dict[str, NodeWatch | str]  # the node's answer, or why it gave none
    health: str
    metrics: Metrics
    events: list[Event]
    seconds: float

    def line(self) -> str:
        """One status line: time, ranks, health, memory, requests."""
        stamp = datetime.fromtimestamp(self.time, tz=UTC).strftime("%H:%M:%S")
        states, mems = [], []
        for node, answer in self.nodes.items():
            if isinstance(answer, str):
                states.append(f"{node} unreachable")
                continue
            states += [f"r{r} {s.state}" for r, s in sorted(answer.ranks.items())]
            if answer.mem_available is not None:
                mems.append(f"{node} {format_size(answer.mem_available)}")
        m = self.metrics
        shown = (("running {:g}", m.running), ("waiting {:g}", m.waiting), ("KV {:.0%}", m.kv_usage),
                 ("accept {:.2f}", m.spec_accept))  # fmt: skip
        figures = [form.format(value) for form, value in shown if value is not None]
        parts = [stamp, self.status, ", ".join(states), f"health {self.health}", "MemAvailable " + ", ".join(mems)]
        return "  ".join(p for p in [*parts, ", ".join(figures)] if p)


@dataclass
class _Seen:
    """What the previous polls saw, so only changes become events."""

    exited: set[tuple[str | None, int]] = field(default_factory=set)  # (instance, rank) reported
    unreachable: set[str] = field(default_factory=set)
    healthy: bool | None = None
    low: set[str] = field(default_factory=set)
    low_water: dict[str, int] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    foreign: bool = False


def _bench_cap(store: Store, name: str, now: float) -> int | None:
    """The most requests a bench of deployment name running now sends at once, or None when no
    bench of it runs (or it states no cap: an open-loop run without --max-concurrency)."""
    for run in BenchStore(store).list_runs(limit=20):
        if run.deployment != name or run.status != "running":
            continue
        started = datetime.fromisoformat(run.created_at)
        started = started if started.tzinfo else started.replace(tzinfo=UTC)
        if now - started.timestamp() > BENCH_STALE_S:
            continue
        config = run.meta.get("config", {}) if isinstance(run.meta, dict) else {}
        if run.kind == "prefill":
            return 1
        conc = config.get("concurrency")
        if isinstance(conc, list | tuple) and conc:
            return int(max(conc))
        if isinstance(config.get("max_concurrency"), int):
            return int(config["max_concurrency"])
    return None


class Watcher:
    """Polls one deployment; ``poll()`` once, ``run()`` until stopped."""

    def __init__(self, name: str, *, connect: Connector = transport_for, interval: float = DEFAULT_INTERVAL_S,
                 on_event: Callable[[Event], None] = lambda _e: None) -> None:  # fmt: skip
        self.name = name
        self.store = Store()
        self.records = Deployments(self.store)
        self.series = WatchSeries(self.store)
        self.interval = max(interval, MIN_INTERVAL_S)
        self.on_event = on_event
        self.http = httpx.Client(timeout=5.0)
        self._transports: dict[str, Transport] = {}
        self._connect_fn = connect
        self.seen = _Seen()
        self.stop = threading.Event()
        self.outcome: Outcome | None = None

    def connect(self, node: Node) -> Transport:
        """One transport per node for the watcher's life (ssh keeps its master connection)."""
        if node.name not in self._transports:
            self._transports[node.name] = self._connect_fn(node)
        return self._transports[node.name]

    def _event(self, events: list[Event], kind: str, message: str, node: str | None = None) -> None:
        event = Event(time.time(), kind, message, node)
        self.records.event(self.name, kind, message, node)
        events.append(event)
        self.on_event(event)

    def poll(self) -> Poll:
        """One round: every node, rank 0's health and metrics; record, compare, react."""
        start = time.monotonic()
        record = self.records.require(self.name)
        now = time.time()
        events: list[Event] = []
        on = {r.node.name: r.node for r in record.ranks}
        outcomes = fan_out(list(on), lambda n: watch_node(self.connect(on[n]), on[n],
                                                          [r for r in record.ranks if r.node.name == n]))  # fmt: skip
        nodes: dict[str, NodeWatch | str] = {n: o.value if o.ok and o.value is not None else str(o.error)
                                             for n, o in outcomes.items()}  # fmt: skip
        health, healthy = rank0_health(record, timeout=5.0)
        metrics = self._metrics(record) if healthy else Metrics()
        plan = self.records.stored_plan(self.name)
        serve = plan.serve if plan else ServeSpec()
        watching = record.status in ("ready", "degraded")
        dead = self._rank_events(record, nodes, events) if watching else []
        self._node_events(nodes, serve, events)
        if watching:
            self._health_events(health, healthy, events)
            self._foreign_events(metrics, now, events)
        self.series.add(self.name, self._samples(record, nodes, now, health, metrics))
        if dead and record.status == "ready":
            self.records.set_status(self.name, "degraded")
        if dead and serve.restart == "on-failure":
            self.outcome = recover(self.records.require(self.name), "; ".join(dead), records=self.records,
                                   connect=self.connect, emit=lambda k, m, n: self._event(events, k, m, n),
                                   stop=self.stop)  # fmt: skip
            # The restarted deployment is another instance: its ranks are new to this watcher.
            self.seen.healthy = None
        status = self.records.require(self.name).status
        return Poll(now, status, nodes, health, metrics, events, time.monotonic() - start)

    def _rank_events(self, record: Deployment, nodes: dict[str, NodeWatch | str], events: list[Event]) -> list[str]:
        dead = []
        for rank in record.ranks:
            answer = nodes.get(rank.node.name)
            if not isinstance(answer, NodeWatch):
                continue
            state = answer.ranks.get(rank.rank)
            key = (record.instance, rank.rank)
            if state is None or state.state == "running" or key in self.seen.exited:
                continue
            self.seen.exited.add(key)
            what = self._describe_exit(record, rank, state)
            dead.append(what.splitlines()[0])
            self._event(events, "rank-exited", what, rank.node.name)
        return dead

    def _describe_exit(self, record: Deployment, rank: RankHandle, state: RankState) -> str:
        how = exit_detail(state, record.ready_at) if state.state == "exited" else "it is gone (no pid file)"
        head = f"rank {rank.rank} on {rank.node.name} exited: {how}"
        try:
            text = rank_log(rank, self.connect(rank.node), LOG_LINES)
        except SparkfleetError as exc:
            return f"{head}\n(its log could not be read: {exc.message})"
        return f"{head}\nlast log lines:\n{tail(text, LOG_LINES)}"

    def _node_events(self, nodes: dict[str, NodeWatch | str], serve: ServeSpec, events: list[Event]) -> None:
        for node, answer in nodes.items():
            if isinstance(answer, str):
                if node not in self.seen.unreachable:
                    self.seen.unreachable.add(node)
                    self._event(events, "node-unreachable", f"{node} did not answer: {answer}", node)
                continue
            if node in self.seen.unreachable:
                self.seen.unreachable.discard(node)
                self._event(events, "node-back", f"{node} answers again", node)
            if (mem := answer.mem_available) is None:
                continue
            self.seen.low_water[node] = min(mem, self.seen.low_water.get(node, mem))
            if serve.mem_floor is None:
                continue
            if mem < serve.mem_floor and node not in self.seen.low:
                self.seen.low.add(node)
                self._event(events, "mem-low", f"{node}: MemAvailable {format_size(mem)} is under the floor "
                            f"{format_size(serve.mem_floor)} ([serve] mem_floor)", node)  # fmt: skip
            elif mem >= serve.mem_floor and node in self.seen.low:
                self.seen.low.discard(node)
                self._event(events, "mem-ok", f"{node}: MemAvailable {format_size(mem)} is over the floor again "
                            f"(low-water {format_size(self.seen.low_water[node])})", node)  # fmt: skip

    def _health_events(self, health: str, healthy: bool, events: list[Event]) -> None:
        if self.seen.healthy and not healthy:
            self._event(events, "health-lost", f"rank 0 health: {health}")
        elif self.seen.healthy is False and healthy:
            self._event(events, "health-back", "rank 0 is healthy again")
        self.seen.healthy = healthy

    def _metrics(self, record: Deployment) -> Metrics:
        try:
            answer = self.http.get(record.endpoint + "/metrics")
        except httpx.HTTPError:
            return Metrics()
        if answer.status_code != 200:
            return Metrics()
        first = partial(sm.first, sm.parse_prometheus(answer.text))
        accept, accepted, drafts = first(sm.SPEC_ACCEPT_GAUGE), first(sm.SPEC_ACCEPTED), first(sm.SPEC_DRAFTS)
        if accept is None and accepted is not None and drafts is not None:
            # vLLM exports counters: tokens per step over the last interval, as `vllm bench serve`.
            d_acc = accepted - self.seen.counters.get("accepted", accepted)
            d_drafts = drafts - self.seen.counters.get("drafts", drafts)
            self.seen.counters.update(accepted=accepted, drafts=drafts)
            accept = d_acc / d_drafts + 1 if d_drafts > 0 else None
        return Metrics(first(sm.RUNNING), first(sm.WAITING), first(sm.KV_USAGE), accept)

    def _foreign_events(self, metrics: Metrics, now: float, events: list[Event]) -> None:
        if metrics.running is None:
            return
        cap = _bench_cap(self.store, self.name, now)
        foreign = cap is not None and metrics.running > cap
        if foreign and not self.seen.foreign:
            self._event(events, "foreign-requests", f"{metrics.running:g} requests running while the bench sends at "
                        f"most {cap}: someone else's requests land on the server during the bench")  # fmt: skip
        self.seen.foreign = foreign

    def _samples(self, record: Deployment, nodes: dict[str, NodeWatch | str], now: float, health: str,
                 metrics: Metrics) -> list[Sample]:  # fmt: skip
        head = record.ranks[0].node.name
        out = []
        for node, answer in nodes.items():
            if isinstance(answer, str):
                out.append(Sample(now, node, None, None, "unreachable"))
                continue
            ranks = ", ".join(f"r{r} {s.state}" for r, s in sorted(answer.ranks.items()))
            m = metrics
            figures = (health, m.running, m.waiting, m.kv_usage, m.spec_accept) if node == head else ()
            out.append(Sample(now, node, answer.mem_available, answer.seconds * 1000, ranks, *figures))
        return out

    def run(self, count: int | None = None, on_poll: Callable[[Poll], None] = lambda _p: None) -> int:
        """Poll every interval until stopped, count polls were made, the deployment was taken
        down (0), or the restart policy gave up (1)."""
        polls = 0
        while not self.stop.is_set():
            began, result = time.monotonic(), self.poll()
            polls += 1
            on_poll(result)
            if result.status in ("stopped", "leftover"):
                return 0
            if self.outcome is not None and not self.outcome.ready:
                return 1
            if count is not None and polls >= count:
                return 0
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - began)))
        return 0
