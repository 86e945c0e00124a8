"""What the engine itself says during a benchmark tier: running requests, KV cache, speculation.

A tier is clean only if nothing but the bench ran on the server during it (docs/tp4.md: any
``#running-req`` above the benched concurrency means foreign traffic landed in the window). The
engine's own count comes from its Prometheus ``/metrics`` (``vllm:num_requests_running``,
``sglang:num_running_reqs``, llama-server's ``llamacpp:requests_processing``) polled while the
tier runs, or, for an SGLang served without ``--enable-metrics``, from the ``#running-req: N``
of the ``Decode batch`` / ``Prefill batch`` lines appended to its log meanwhile.

Each poll is compared with the most requests the bench itself had in flight while that poll
was under way (the peak between sending the scrape and reading its answer): the server can lag
the client (a request sent but not yet admitted, one finished but not yet closed on our side),
never lead it, so any excess is someone else's. The tier's ``foreign_requests`` is the largest
excess seen.

Besides, per tier: KV-cache usage (mean and peak of ``vllm:kv_cache_usage_perc``,
``sglang:token_usage``), the waiting queue, the prefix-cache hit rate and speculative
acceptance from counter deltas (vLLM ``spec_decode_num_accepted_tokens`` /
``spec_decode_num_drafts`` + 1 = tokens per step, as ``vllm bench serve`` reports it; SGLang's
``spec_accept_length`` gauge), and the engine's own decode step time (the mean of
``vllm:request_time_per_output_token_seconds`` / ``inter_token_latency_seconds`` over the tier,
from the histogram's sum and count deltas).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
# llama.cpp exported its KV-cache ratio up to mid-2025 (b4747 has it); later builds export none.
KV_USAGE = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
)
SPEC_ACCEPT_GAUGE = ("sglang:spec_accept_length",)
# Counters read as before/after deltas; vLLM's prometheus client exports them with a _total suffix.
PREFIX_HITS = ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
PREFIX_QUERIES = ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")
SPEC_ACCEPTED = ("vllm:spec_decode_num_accepted_tokens",)
SPEC_DRAFTS = ("vllm:spec_decode_num_drafts",)
STEP_TIME = ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds",
             "vllm:inter_token_latency_seconds")  # fmt: skip

# Ratios of one cache: with several label sets (data-parallel engines, models) the fullest one is
# the figure, not their sum.
_RATIOS = frozenset(KV_USAGE)
_LOG_RUNNING = re.compile(r"#running-req:\s*(\d+)")
_LOG_USAGE = re.compile(r"token usage:\s*([0-9.]+)")
_LOG_ACCEPT = re.compile(r"accept len:\s*([0-9.]+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name → value, read with prometheus_client's own parser: counts and counters summed
    over label sets (several engines or models on one server), cache-use ratios their largest.

    ``_total`` is dropped from counter names so a name means the same across client versions;
    a counter's ``_created`` timestamp and NaN values are skipped. A scrape the parser cannot read
    gives {} (the tier then has no engine figures, said in its note).
    """
    out: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return {}
    for family in families:
        for sample in family.samples:
            name, value = sample.name, float(sample.value)
            if math.isnan(value) or (family.type == "counter" and name.endswith("_created")):
                continue
            if family.type in ("counter", "unknown") and name.endswith("_total"):  # unknown: no TYPE line
                name = name[: -len("_total")]
            if name in _RATIOS:
                out[name] = max(out.get(name, value), value)
            else:
                out[name] = out.get(name, 0.0) + value
    return out


def first(values: Mapping[str, float], names: Iterable[str]) -> float | None:
    """The value of the first of ``names`` present."""
    for name in names:
        if name in values:
            return values[name]
    return None


def parse_running_log(lines: Iterable[str]) -> list[tuple[int, float | None, float | None]]:
    """(running requests, KV token usage, accept length) of every SGLang batch line with a
    ``#running-req``; the last two None where the line has none."""
    out = []
    for line in lines:
        m = _LOG_RUNNING.search(line)
        if m is None:
            continue
        usage, accept = _LOG_USAGE.search(line), _LOG_ACCEPT.search(line)
        kv = float(usage.group(1)) if usage else None
        out.append((int(m.group(1)), kv, float(accept.group(1)) if accept else None))
    return out


@dataclass
class InFlight:
    """The bench's own count of requests in flight, with the peak since a poll began."""

    now: int = 0
    peak: int = 0

    def up(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def down(self) -> None:
        self.now -= 1

    def begin_poll(self) -> None:
        self.peak = self.now


@dataclass(frozen=True)
class ServerFigures:
    """The engine's account of one tier; None where it exports nothing of the kind."""

    source: str | None  # "metrics", "log" or None (nothing tells the running count)
    polls: int
    running_max: int | None
    foreign_requests: int | None  # most requests seen running beyond the bench's own
    waiting_max: int | None
    kv_usage_mean: float | None  # fraction 0..1
    kv_usage_max: float | None
    prefix_cache_hit_rate: float | None  # hits / queries over the tier
    spec_accept_length: float | None  # tokens per decode step (accepted per draft + 1)
    server_tpot_ms: float | None  # the engine's mean time per output token over the tier
    note: str | None = None

    @property
    def foreign(self) -> bool:
        return bool(self.foreign_requests)


@dataclass
class _Series:
    running: list[int] = field(default_factory=list)
    foreign: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    kv: list[float] = field(default_factory=list)
    accept: list[float] = field(default_factory=list)


class ServerWatch:
    """Polls ``/metrics`` (or tails an SGLang log) for one tier; ``figures()`` once it stopped."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        metrics_url: str | None,
        inflight: InFlight,
        *,
        log_path: Path | None = None,
        interval: float = 0.25,
    ) -> None:
        self.client = client
        self.metrics_url = metrics_url
        self.inflight = inflight
        self.log_path = log_path
        self.interval = interval
        self.series = _Series()
        self.before: dict[str, float] | None = None
        self.after: dict[str, float] | None = None
        self.has_running_gauge = False
        self.metrics_error: str | None = None
        self._log_offset = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        """Take the counters' starting values, then poll in the background."""
        if self.log_path is not None and self.log_path.exists():
            self._log_offset = self.log_path.stat().st_size
        self.before = await self._scrape() if self.metrics_url else None
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> ServerFigures:
        """Stop polling, take the counters' final values and sum up."""
        self._stop.set()
        if self._task is not None:
            await self._task
        if self.metrics_url:
            self.after = await self._scrape()
        self._read_log()
        return self.figures()

    async def _loop(self) -> None:
        while not self._stop.is_set():
            await self._poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)

    async def _poll(self) -> None:
        self.inflight.begin_poll()
        if self.metrics_url:
            values = await self._scrape()
            ours = self.inflight.peak
            if values is not None:
                running = first(values, RUNNING)
                if running is not None:
                    self.has_running_gauge = True
                    self._note_running(int(running), ours)
                waiting = first(values, WAITING)
                if waiting is not None:
                    self.series.waiting.append(int(waiting))
                kv = first(values, KV_USAGE)
                if kv is not None:
                    self.series.kv.append(kv)
                accept = first(values, SPEC_ACCEPT_GAUGE)
                if accept is not None and accept > 0:
                    self.series.accept.append(accept)
        if not self.has_running_gauge:
            self._read_log()

    def _note_running(self, running: int, ours: int) -> None:
        self.series.running.append(running)
        self.series.foreign.append(max(0, running - ours))

    def _read_log(self) -> None:
        """New SGLang batch lines since the last read: each against the bench's peak meanwhile."""
        if self.log_path is None or self.has_running_gauge or not self.log_path.exists():
            return
        with self.log_path.open("rb") as fh:
            fh.seek(self._log_offset)
            data = fh.read()
        cut = data.rfind(b"\n") + 1
        self._log_offset += cut
        ours = self.inflight.peak
        for running, usage, accept in parse_running_log(data[:cut].decode(errors="replace").splitlines()):
            self._note_running(running, ours)
            if usage is not None:
                self.series.kv.append(usage)
            if accept is not None:
                self.series.accept.append(accept)
        self.inflight.begin_poll()

    async def _scrape(self) -> dict[str, float] | None:
        assert self.metrics_url is not None
        try:
            response = await self.client.get(self.metrics_url, timeout=5.0)
        except httpx.HTTPError as exc:
            self.metrics_error = f"GET {self.metrics_url}: {type(exc).__name__}"
            return None
        if response.status_code != 200:
            self.metrics_error = f"GET {self.metrics_url}: HTTP {response.status_code}"
            return None
        return parse_prometheus(response.text)

    def figures(self) -> ServerFigures:
        s = self.series
        source = "metrics" if self.has_running_gauge else ("log" if s.running else None)
        delta = _deltas(self.before, self.after)
        hits, queries = first(delta, PREFIX_HITS), first(delta, PREFIX_QUERIES)
        accepted, drafts = first(delta, SPEC_ACCEPTED), first(delta, SPEC_DRAFTS)
        accept = (
            1.0 + accepted / drafts
            if accepted is not None and drafts
            else (sum(s.accept) / len(s.accept) if s.accept else None)
        )
        step = None
        for name in STEP_TIME:
            total, count = delta.get(name + "_sum"), delta.get(name + "_count")
            if total is not None and count:
                step = 1000.0 * total / count
                break
        note = None
        if source is None:
            why = f" ({self.metrics_error})" if self.metrics_error else ""
            hint = "" if self.log_path else "; an SGLang log can be read with --engine-log"
            note = f"the server exports no running-requests gauge{why}{hint}"
        return ServerFigures(
            source=source,
            polls=len(s.running),
            running_max=max(s.running) if s.running else None,
            foreign_requests=max(s.foreign) if s.foreign else None,
            waiting_max=max(s.waiting) if s.waiting else None,
            kv_usage_mean=sum(s.kv) / len(s.kv) if s.kv else None,
            kv_usage_max=max(s.kv) if s.kv else None,
            prefix_cache_hit_rate=hits / queries if hits is not None and queries else None,
            spec_accept_length=accept,
            server_tpot_ms=step,
            note=note,
        )


def _deltas(before: Mapping[str, float] | None, after: Mapping[str, float] | None) -> dict[str, float]:
    if not before or not after:
        return {}
    return {k: after[k] - before[k] for k in after.keys() & before.keys()}


def metrics_url(base_url: str) -> str:
    """Where an OpenAI-compatible engine serves Prometheus text: the same host, ``/metrics``."""
    return base_url.rstrip("/") + "/metrics"
