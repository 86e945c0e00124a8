"""Open-loop benchmark (``bench serve``): requests arrive on a schedule, not when a slot frees.

For each asked rate (a sweep is several), each repeat: draw the tier's conversations, draw the
arrival schedule (``arrivals.py``), start watching the engine (``server_metrics.py``), then send
every arrival at its offset from the tier's start — its turns one after the other, each through
the bench's one streaming client, under ``--max-concurrency`` when set — and sum up with
``stats.serve_run_stats``. A send that the cap or the event loop delays is sent late, never
dropped, and the achieved rate says so.

Before the first measured tier, ``discard_runs`` runs of the first tier (at most
``DISCARD_REQUESTS`` requests each) are sent and thrown away: docs/tp4.md's rule that the first
two runs after a boot measure cold caches and one-off compilation, not the engine.

Exact output lengths are asked as ``bench decode`` asks them (its probe decides between
``min_tokens`` + ``ignore_eos``, ``ignore_eos`` alone, or nothing) unless the dataset brings its
own lengths.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sparkfleet.bench.arrivals import INF, Arrivals, rate_label, schedule, schedule_for
from sparkfleet.bench.client import Api, RequestRecord, RequestSpec, check_api, stream_request
from sparkfleet.bench.corpus import haystack
from sparkfleet.bench.decode import DecodeConfig, ExactLength, probe_exact_length
from sparkfleet.bench.endpoint import Endpoint
from sparkfleet.bench.prefill import CALIBRATION_CHARS, PrefillConfig, TokenCounter
from sparkfleet.bench.progress import NullProgress, Progress
from sparkfleet.bench.server_metrics import InFlight, ServerFigures, ServerWatch, metrics_url
from sparkfleet.bench.stats import SLO, ServeRunStats, serve_run_stats
from sparkfleet.bench.workload import Conversation, Workload, WorkloadConfig
from sparkfleet.errors import BenchError

DISCARD_REQUESTS = 16


@dataclass(frozen=True)
class ServeConfig:
    """What ``bench serve`` runs."""

    rates: tuple[float, ...] = (INF,)
    burstiness: float = 1.0
    max_concurrency: int | None = None
    requests: int | None = 100
    duration: float | None = None
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    slo: SLO | None = None
    repeats: int = 1
    discard_runs: int = 2
    strict: bool = False
    seed: int = 0
    api: Api = "chat"
    temperature: float = 0.0
    timeout: float = 600.0
    watch_metrics: bool = True
    engine_log: str | None = None
    # Each scrape costs the engine's API process a little (docs/tp4.md: a 2 s nvidia-smi poll costs
    # ~0.6 ms per step); once a second still catches any foreign request that lasts a second.
    poll_interval: float = 1.0
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.rates:
            raise BenchError("no --request-rate given")
        for rate in self.rates:
            Arrivals(rate, self.burstiness)
        if (self.requests is None) == (self.duration is None):
            raise BenchError("give one of --num-prompts N or --duration S")
        if self.requests is not None and self.requests < 1:
            raise BenchError("--num-prompts must be at least 1")
        if self.duration is not None and not self.duration > 0:
            raise BenchError("--duration must be a positive number of seconds")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise BenchError("--max-concurrency must be at least 1")
        if self.duration is not None and INF in self.rates and self.max_concurrency is None:
            raise BenchError("--duration with --request-rate inf needs --max-concurrency")
        if self.repeats < 1 or self.discard_runs < 0:
            raise BenchError("--repeats must be at least 1 and --discard-runs at least 0")
        check_api(self.api)
        if self.workload.dataset == "multiturn" and self.workload.turns < 2:
            raise BenchError("--dataset-name multiturn needs --turns 2 or more")
        if self.workload.dataset.endswith((".jsonl", ".json")) and not os.path.isfile(self.workload.dataset):
            raise BenchError(f"--dataset-path {self.workload.dataset}: no such file")
        if self.engine_log is not None and not os.path.isfile(self.engine_log):
            raise BenchError(f"--engine-log {self.engine_log}: no such file")


@dataclass(frozen=True)
class ServeTierRun:
    """One measured run of one rate tier."""

    rate: float
    repeat: int
    records: tuple[RequestRecord, ...]
    stats: ServeRunStats

    @property
    def tier(self) -> str:
        return rate_label(self.rate)

    @property
    def foreign_requests(self) -> int | None:
        server = self.stats.server or {}
        value = server.get("foreign_requests")
        return int(value) if isinstance(value, int) else None


@dataclass
class _Sent:
    records: list[RequestRecord] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)


async def _converse(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    conv: Conversation,
    base: RequestSpec,
    sem: asyncio.Semaphore | None,
    inflight: InFlight,
    sent: _Sent,
    on_done: Callable[[RequestRecord], None],
) -> None:
    replies: list[str] = []
    for turn in range(len(conv.turns)):
        spec = conv.spec(turn, replies, base.api, base)
        if sem is not None:
            await sem.acquire()
        inflight.up()
        if turn == 0:
            sent.arrivals.append(time.perf_counter())
        try:
            rec = await stream_request(client, endpoint.base_url, endpoint.model, spec)
        finally:
            inflight.down()
            if sem is not None:
                sem.release()
        sent.records.append(rec)
        sent.asked.append(spec.max_tokens)
        on_done(rec)
        if not rec.ok:
            return  # a conversation whose turn failed has no history to go on with
        replies.append(rec.text)


async def send_schedule(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    conversations: list[Conversation],
    offsets: list[float],
    base: RequestSpec,
    max_concurrency: int | None,
    inflight: InFlight,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> tuple[float, _Sent]:
    """Send conversation ``i`` at ``offsets[i]`` seconds after now; (the tier's start, what was sent)."""
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    sent = _Sent()
    done = on_done or (lambda _rec: None)
    loop = asyncio.get_running_loop()
    t0_loop = loop.time()
    t0 = time.perf_counter()
    tasks = []
    for conv, offset in zip(conversations, offsets, strict=True):
        delay = t0_loop + offset - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_converse(client, endpoint, conv, base, sem, inflight, sent, done)))
    await asyncio.gather(*tasks)
    return t0, sent


class ServeBench:
    """One ``bench serve`` session against one endpoint."""

    def __init__(self, endpoint: Endpoint, config: ServeConfig, progress: Progress | None = None) -> None:
        self.endpoint = endpoint
        self.config = config
        self.progress = progress or NullProgress()

    def _offsets(self, rate: float, seed: int, limit: int | None = None) -> list[float]:
        arrivals = Arrivals(rate, self.config.burstiness)
        if self.config.requests is not None:
            return schedule(arrivals, min(self.config.requests, limit or self.config.requests), seed)
        offsets = schedule_for(arrivals, self.config.duration or 0.0, seed)
        return offsets[:limit] if limit else offsets

    async def _run_tier(
        self, client: httpx.AsyncClient, workload: Workload, base: RequestSpec, rate: float, seed: int, label: str,
        limit: int | None = None,
    ) -> tuple[list[RequestRecord], list[int], list[float], float, ServerFigures | None]:  # fmt: skip
        cfg = self.config
        # A duration at rate inf is closed loop under the cap: no schedule, senders until the deadline.
        deadline_bound = cfg.duration is not None and rate == INF
        offsets = [] if deadline_bound else self._offsets(rate, seed, limit)
        inflight = InFlight()
        log = Path(cfg.engine_log) if cfg.engine_log else None
        url = metrics_url(self.endpoint.base_url) if cfg.watch_metrics else None
        watch = ServerWatch(client, url, inflight, log_path=log, interval=cfg.poll_interval) if url or log else None
        if watch is not None:
            await watch.start()
        self.progress.start(label, limit or 0 if deadline_bound else len(offsets))
        try:
            if deadline_bound:
                t0, sent = await self._closed_until(client, workload, base, inflight, limit)
            else:
                convs = workload.draw(len(offsets))
                t0, sent = await send_schedule(
                    client, self.endpoint, convs, offsets, base, cfg.max_concurrency, inflight, self.progress.advance
                )
        finally:
            figures = await watch.stop() if watch is not None else None
        return sent.records, sent.asked, sent.arrivals, t0, figures

    async def _closed_until(
        self, client: httpx.AsyncClient, workload: Workload, base: RequestSpec, inflight: InFlight, limit: int | None
    ) -> tuple[float, _Sent]:
        """Rate inf for a duration: ``max_concurrency`` senders, each starting a new conversation
        as its last ends, until the deadline (or ``limit`` conversations, for discarded runs)."""
        cfg = self.config
        conc = cfg.max_concurrency or 1
        sent = _Sent()
        t0 = time.perf_counter()
        deadline = t0 + (cfg.duration or 0.0)
        started = 0

        async def sender() -> None:
            nonlocal started
            while time.perf_counter() < deadline and (limit is None or started < limit):
                started += 1
                conv = workload.draw(1)[0]
                await _converse(client, self.endpoint, conv, base, None, inflight, sent, self.progress.advance)

        await asyncio.gather(*(sender() for _ in range(conc)))
        return t0, sent

    async def run(
        self,
        on_run: Callable[[ServeTierRun], None] | None = None,
        on_setup: Callable[[ExactLength, float], None] | None = None,
    ) -> list[ServeTierRun]:
        """Discarded runs, then every rate tier × repeat; ``on_run`` sees each as it ends."""
        cfg = self.config
        conc = cfg.max_concurrency or 64
        limits = httpx.Limits(max_connections=max(conc, 64) + 4, max_keepalive_connections=max(conc, 64) + 4)
        timeout = httpx.Timeout(cfg.timeout, connect=10.0)
        runs: list[ServeTierRun] = []
        async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=self.endpoint.headers()) as client:
            exact = await probe_exact_length(
                client, self.endpoint, DecodeConfig(api=cfg.api, temperature=cfg.temperature, extra_body=cfg.extra_body)
            )
            counter = TokenCounter(client, self.endpoint, PrefillConfig(extra_body=cfg.extra_body))
            cpt = CALIBRATION_CHARS / max(1, await counter.count(haystack(CALIBRATION_CHARS, seed=7)))
            if on_setup is not None:
                on_setup(exact, cpt)
            base = RequestSpec(
                api=cfg.api,
                prompt="",
                max_tokens=1,
                # Not sent as such: Conversation.spec asks min_tokens = each turn's length when set.
                min_tokens=0 if "min_tokens" in exact.params else None,
                ignore_eos="ignore_eos" in exact.params,
                temperature=cfg.temperature,
                continuous_usage=self.endpoint.engine == "vllm",
                extra=cfg.extra_body,
            )
            workload = Workload(cfg.workload, cpt, cfg.seed)
            first = cfg.rates[0]
            for d in range(cfg.discard_runs):
                label = f"{rate_label(first)} discarded run {d + 1}/{cfg.discard_runs}"
                recs, *_ = await self._run_tier(client, workload, base, first, cfg.seed + 1000 + d, label,
                                                limit=DISCARD_REQUESTS)  # fmt: skip
                self.progress.finish(None)
                _raise_if_all_failed(self.endpoint, label, recs)
            for i, rate in enumerate(cfg.rates):
                for rep in range(cfg.repeats):
                    label = f"{rate_label(rate)} run {rep + 1}/{cfg.repeats}"
                    # Every run its own schedule, so repeats sample the arrival process.
                    seed = cfg.seed + i * 100 + rep
                    recs, asked, sends, t0, figures = await self._run_tier(client, workload, base, rate, seed, label)
                    stats = serve_run_stats(
                        recs,
                        rate=rate,
                        process=Arrivals(rate, cfg.burstiness).process,
                        max_concurrency=cfg.max_concurrency,
                        arrival_times=sends,
                        tier_start=t0,
                        requested_tokens=asked,
                        slo=cfg.slo,
                        server=asdict(figures) if figures is not None else None,
                    )
                    run = ServeTierRun(rate, rep, tuple(recs), stats)
                    runs.append(run)
                    if on_run is not None:
                        on_run(run)
                    self.progress.finish(summary_line(run))
                    _raise_if_all_failed(self.endpoint, label, recs)
                    if cfg.strict and figures is not None and figures.source is None:
                        raise BenchError(
                            f"--strict needs the engine's running-request count and {self.endpoint.base_url} "
                            f"gives none: {figures.note}"
                        )
                    if cfg.strict and run.foreign_requests:
                        raise BenchError(
                            f"tier {run.tier} run {rep + 1}: {run.foreign_requests} requests beyond the bench's own "
                            "ran on the server (foreign traffic in the window); aborted by --strict"
                        )
        return runs


def summary_line(run: ServeTierRun) -> str:
    """One line per finished tier run, for the progress log."""
    s = run.stats
    parts = [
        f"{run.tier} run {run.repeat + 1}: achieved {_fmt(s.achieved_rate, 2)}/s",
        f"{_fmt(s.request_throughput, 2)} req/s",
        f"{_fmt(s.output_throughput)} tok/s",
        f"TTFT p50 {_fmt(s.ttft.p50, 0)} ms",
        f"TPOT p50 {_fmt(s.tpot.p50)} ms",
    ]
    if s.goodput is not None:
        parts.append(f"goodput {_fmt(s.goodput, 2)}/s ({100 * (s.good_share or 0):.0f} %)")
    if s.failed:
        parts.append(f"{s.failed} failed")
    if run.foreign_requests:
        parts.append(f"FOREIGN: {run.foreign_requests} requests not ours ran")
    return ", ".join(parts)


def _raise_if_all_failed(endpoint: Endpoint, label: str, records: list[RequestRecord]) -> None:
    if records and not any(r.ok for r in records):
        raise BenchError(f"endpoint {endpoint.base_url}: every request of {label} failed: {records[0].error}")


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
