"""Benchmark arithmetic: pure functions from request records to the numbers users read.

Definitions (the docs repeat them):

- Per-stream tok/s of one request: ``(completion_tokens - 1) / (t_last - t_first)`` over its
  generated chunks — decode speed, the first token's prefill excluded (sparkDash, llama-benchy).
- Steady window of a run with concurrency ``c`` and ``n`` requests: from the moment the ``c``-th
  request received its first token (every slot is decoding) to the moment the ``c``-th from last
  request received its last token (after that fewer than ``c`` streams remain). With one wave
  (``n == c``) that is [latest first token, earliest last token]; at c1 it is one request's
  decode. Aggregate tok/s = tokens that arrived inside the window / its length, with each
  chunk's tokens taken from running usage when the server reports it, else the request's
  ``usage.completion_tokens`` spread evenly over its chunks. Should the window be empty (a
  straggler's prefill outlasts another stream's decode) the whole span from the first first-token
  to the last last-token is used and the run says so.
- ``output_throughput``: vLLM's definition, total completion tokens / (last stream closed − first
  send), kept so our numbers line up with ``vllm bench serve``.
- TTFT, TPOT ((E2E − TTFT)/(tokens − 1)), ITL (gaps between generated chunks), E2EL as in vLLM;
  percentiles by linear interpolation (numpy's default, as vLLM).
- Repeats: median with min–max; a tier whose runs spread more than 10 % of the median is flagged.
- Prefill rate = prompt tokens / (TTFT − fixed overhead), the overhead being the median TTFT of
  tiny requests; the correction is capped at 80 % of TTFT so a noisy overhead cannot explode it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from sparkfleet.bench.client import RequestRecord
from sparkfleet.errors import BenchError

_SLO_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2e", "e2el": "e2e"}

SPREAD_FLAG = 0.10
OVERHEAD_CAP = 0.8
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Dist:
    """Mean and percentiles of one latency metric, in milliseconds."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    n: int

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Dist:
        if not seconds:
            return cls(None, None, None, None, 0)
        ms = np.asarray(seconds, dtype=float) * 1000.0
        p50, p90, p99 = (float(x) for x in np.percentile(ms, PERCENTILES))
        return cls(float(ms.mean()), p50, p90, p99, len(ms))


@dataclass(frozen=True)
class DecodeRunStats:
    """One run of one decode tier (one prompt type at one concurrency)."""

    concurrency: int
    requested_tokens: int
    requests: int
    completed: int
    failed: int
    errors: tuple[str, ...]
    length_mismatch: int  # completed requests whose usage.completion_tokens != requested
    total_input_tokens: int
    total_output_tokens: int
    cached_tokens: int
    duration: float  # first send → last stream end, seconds
    output_throughput: float | None  # vLLM definition
    steady_tps: float | None
    steady_window: float | None  # seconds
    steady_full_span: bool  # the window fell back to the whole span
    per_stream_tps: float | None  # median over requests
    per_stream_min: float | None
    per_stream_max: float | None
    ttft: Dist
    ttfr: Dist
    tpot: Dist
    itl: Dist
    e2el: Dist


@dataclass(frozen=True)
class Spread:
    """Median and range of one figure over repeated runs; ``flagged`` past 10 % spread."""

    median: float | None
    low: float | None
    high: float | None
    n: int

    @property
    def rel_spread(self) -> float | None:
        if self.median is None or self.low is None or self.high is None or self.median == 0:
            return None
        return (self.high - self.low) / self.median

    @property
    def flagged(self) -> bool:
        rel = self.rel_spread
        return rel is not None and rel > SPREAD_FLAG

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread:
        vals = [float(v) for v in values if v is not None]
        if not vals:
            return cls(None, None, None, 0)
        return cls(float(np.median(vals)), min(vals), max(vals), len(vals))


def token_times(rec: RequestRecord) -> list[tuple[float, float]]:
    """(absolute time, tokens) for each generated chunk of a completed request."""
    if not rec.chunk_times or not rec.completion_tokens:
        return []
    if rec.chunk_tokens is not None and sum(rec.chunk_tokens) == rec.completion_tokens:
        return [(rec.start + t, float(k)) for t, k in zip(rec.chunk_times, rec.chunk_tokens, strict=True)]
    each = rec.completion_tokens / len(rec.chunk_times)
    return [(rec.start + t, each) for t in rec.chunk_times]


def per_stream_tps(rec: RequestRecord) -> float | None:
    """Decode tok/s of one request: (tokens − 1) / (last chunk − first chunk)."""
    if not rec.ok or not rec.completion_tokens or rec.completion_tokens < 2 or len(rec.chunk_times) < 2:
        return None
    span = rec.chunk_times[-1] - rec.chunk_times[0]
    return (rec.completion_tokens - 1) / span if span > 0 else None


def server_decode_tps(rec: RequestRecord) -> float | None:
    """The engine's own decode tok/s for one request, when it reports one (llama.cpp's
    ``timings.predicted_per_second``: tokens generated / time from the first sampled token to the
    last). It counts every generated token over the steps after the first, so it reads about
    ``n / (n - 1)`` of ``per_stream_tps``: 0.4 % above at 256 tokens."""
    value = (rec.server_timings or {}).get("predicted_per_second")
    return float(value) if value is not None and value > 0 and rec.ok else None


def server_agreement(records: Iterable[RequestRecord]) -> list[tuple[float, float]]:
    """(sparkfleet's per-stream tok/s, the server's own) for each request that has both."""
    out = []
    for rec in records:
        ours, theirs = per_stream_tps(rec), server_decode_tps(rec)
        if ours is not None and theirs is not None:
            out.append((ours, theirs))
    return out


def steady_window(records: Sequence[RequestRecord], concurrency: int) -> tuple[float, float, bool]:
    """(start, end, fell_back) of the steady window, absolute times; see the module docstring."""
    firsts = sorted(r.start + r.chunk_times[0] for r in records)
    lasts = sorted(r.start + r.chunk_times[-1] for r in records)
    c = max(1, min(concurrency, len(records)))
    start, end = firsts[c - 1], lasts[len(records) - c]
    if end > start:
        return start, end, False
    return firsts[0], lasts[-1], True


def steady_throughput(records: Sequence[RequestRecord], concurrency: int) -> tuple[float | None, float | None, bool]:
    """(aggregate tok/s, window seconds, fell_back) over the steady window."""
    usable = [r for r in records if r.ok and r.chunk_times]
    if not usable:
        return None, None, False
    start, end, fell_back = steady_window(usable, concurrency)
    if end <= start:
        return None, None, fell_back
    # A token at exactly `start` is the one that opened the window (at c1, the first token,
    # whose time is prefill): it belongs before the window.
    tokens = sum(k for r in usable for t, k in token_times(r) if start < t <= end)
    return tokens / (end - start), end - start, fell_back


def decode_run_stats(records: Sequence[RequestRecord], concurrency: int, requested_tokens: int) -> DecodeRunStats:
    """All figures of one decode run."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    errors = tuple(dict.fromkeys(r.error or "incomplete" for r in failed))[:5]
    total_out = sum(r.completion_tokens or 0 for r in ok)
    if records:
        first_send = min(r.start for r in records)
        last_done = max(r.start + r.done for r in records)
        duration = last_done - first_send
    else:
        duration = 0.0
    steady, window, fell_back = steady_throughput(ok, concurrency)
    streams = [v for v in (per_stream_tps(r) for r in ok) if v is not None]
    tpots = [t for t in (request_tpot(r) for r in ok) if t is not None]
    itls = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)]
    return DecodeRunStats(
        concurrency=concurrency,
        requested_tokens=requested_tokens,
        requests=len(records),
        completed=len(ok),
        failed=len(failed),
        errors=errors,
        length_mismatch=sum(1 for r in ok if r.completion_tokens != requested_tokens),
        total_input_tokens=sum(r.prompt_tokens or 0 for r in ok),
        total_output_tokens=total_out,
        cached_tokens=sum(r.cached_tokens or 0 for r in ok),
        duration=duration,
        output_throughput=total_out / duration if duration > 0 and ok else None,
        steady_tps=steady,
        steady_window=window,
        steady_full_span=fell_back,
        per_stream_tps=float(np.median(streams)) if streams else None,
        per_stream_min=min(streams) if streams else None,
        per_stream_max=max(streams) if streams else None,
        ttft=Dist.of([r.ttft for r in ok if r.ttft is not None]),
        ttfr=Dist.of([r.ttfr for r in ok if r.ttfr is not None]),
        tpot=Dist.of(tpots),
        itl=Dist.of(itls),
        e2el=Dist.of([r.end for r in ok if r.end is not None]),
    )


@dataclass(frozen=True)
class PrefillSample:
    """One prefill request at one length."""

    target_tokens: int
    prompt_tokens: int | None
    cached_tokens: int
    ttft: float | None  # seconds
    overhead: float  # seconds subtracted from TTFT
    rate: float | None  # prompt tokens / s
    error: str | None


def prefill_rate(prompt_tokens: int, ttft: float, overhead: float) -> float:
    """prompt tokens / (TTFT − overhead), the correction capped at 80 % of TTFT."""
    corrected = ttft - min(overhead, OVERHEAD_CAP * ttft)
    return prompt_tokens / corrected


def prefill_sample(rec: RequestRecord, target_tokens: int, overhead: float) -> PrefillSample:
    """The figures of one prefill request; the rate uses the server's prompt token count."""
    cached = rec.cached_tokens or 0
    rate = None
    if rec.ok and rec.ttft and rec.prompt_tokens:
        rate = prefill_rate(rec.prompt_tokens - cached, rec.ttft, overhead)
    return PrefillSample(
        target_tokens=target_tokens,
        prompt_tokens=rec.prompt_tokens,
        cached_tokens=cached,
        ttft=rec.ttft if rec.ok else None,
        overhead=overhead,
        rate=rate,
        error=rec.error,
    )


# ---------------------------------------------------------------- open-loop (bench serve)


@dataclass(frozen=True)
class SLO:
    """Service-level targets in seconds; a request is good when it meets every one set.

    TPOT of a one-token answer counts as 0, as in ``vllm bench serve --goodput``.
    """

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> SLO | None:
        """``ttft=500ms,tpot=50,e2e=10s`` (or vLLM's ``ttft:500 tpot:50 e2el:10000``) → an SLO in
        seconds; a bare number is milliseconds (as vLLM's); BenchError naming ``--goodput`` otherwise."""
        if not text:
            return None
        targets: dict[str, float] = {}
        for part in text.replace(",", " ").split():
            key, eq, value = part.partition("=") if "=" in part else part.partition(":")
            key = key.strip().lower()
            if not eq or key not in _SLO_KEYS:
                raise BenchError(f"bad --goodput {part!r}: use ttft=…,tpot=…,e2e=… (ms, or with an s or ms unit)")
            value = value.strip().lower()
            scale = 1.0 if value.endswith("s") and not value.endswith("ms") else 1e-3
            try:
                seconds = float(value.removesuffix("ms").removesuffix("s")) * scale
            except ValueError:
                raise BenchError(f"bad --goodput {part!r}: {value!r} is not a time such as 500ms or 2s") from None
            if not seconds > 0 or math.isinf(seconds):
                raise BenchError(f"bad --goodput {part!r}: targets must be positive")
            targets[_SLO_KEYS[key]] = seconds
        return cls(**targets)

    def met(self, rec: RequestRecord) -> bool:
        if not rec.ok:
            return False
        if self.ttft is not None and (rec.ttft is None or rec.ttft > self.ttft):
            return False
        if self.tpot is not None and (request_tpot(rec) or 0.0) > self.tpot:
            return False
        return not (self.e2e is not None and (rec.end is None or rec.end > self.e2e))


def request_tpot(rec: RequestRecord) -> float | None:
    """(E2E − TTFT) / (tokens − 1) of one completed request; None below two tokens."""
    if not rec.ok or not rec.completion_tokens or rec.completion_tokens < 2 or rec.end is None:
        return None
    return (rec.end - (rec.ttft or 0.0)) / (rec.completion_tokens - 1)


@dataclass(frozen=True)
class ServeRunStats:
    """One open-loop tier run: the asked and achieved rates, goodput, latency percentiles.

    ``achieved_rate`` = arrivals / (last arrival's send − the tier's start): what the sender
    managed, which a concurrency cap or a slow client holds below the asked rate. ``goodput`` =
    requests meeting every SLO / duration (vLLM's and DistServe's definition); with no SLO set it
    is None. ``duration`` runs from the tier's start to the last stream's end (vLLM's
    benchmark duration); ``output_throughput`` = completion tokens / duration. ``server`` holds
    the engine's own figures (``ServerFigures`` as a dict).
    """

    request_rate: float  # asked, requests (conversations) per second; inf = all at once
    process: str  # poisson, gamma(k=…), constant, burst
    max_concurrency: int | None
    arrivals: int
    requests: int
    completed: int
    failed: int
    errors: tuple[str, ...]
    achieved_rate: float | None
    request_throughput: float | None  # completed / duration
    goodput: float | None
    good_share: float | None  # good / all requests, failures included
    slo: dict[str, float] | None  # targets in ms
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    cached_tokens: int
    output_throughput: float | None
    max_in_flight: int
    length_mismatch: int
    ttft: Dist
    tpot: Dist
    itl: Dist
    e2el: Dist
    server: dict[str, object] | None = None


def max_in_flight(records: Sequence[RequestRecord]) -> int:
    """The most requests open at once, by a sweep over send and close times."""
    events = sorted([(r.start, 1) for r in records] + [(r.start + r.done, -1) for r in records])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def serve_run_stats(
    records: Sequence[RequestRecord],
    *,
    rate: float,
    process: str,
    max_concurrency: int | None,
    arrival_times: Sequence[float],
    tier_start: float,
    requested_tokens: Sequence[int],
    slo: SLO | None,
    server: dict[str, object] | None = None,
) -> ServeRunStats:
    """All figures of one open-loop run; ``arrival_times`` are the absolute send times the
    scheduler achieved for each arrival, ``requested_tokens`` the max_tokens of each record."""
    base = decode_run_stats(records, max(1, max_concurrency or 1), 0)
    ok = [r for r in records if r.ok]
    span = max(arrival_times) - tier_start if arrival_times else 0.0
    good = sum(1 for r in records if slo is not None and slo.met(r))
    # From the schedule's start, not the first send (which waits for the first gap): vLLM's
    # benchmark duration, so that output tok/s lines up with ``vllm bench serve`` at a rate.
    duration = max((r.start + r.done for r in records), default=tier_start) - tier_start
    return ServeRunStats(
        request_rate=rate,
        process=process,
        max_concurrency=max_concurrency,
        arrivals=len(arrival_times),
        requests=base.requests,
        completed=base.completed,
        failed=base.failed,
        errors=base.errors,
        achieved_rate=len(arrival_times) / span if span > 0 else None,
        request_throughput=len(ok) / duration if duration > 0 else None,
        goodput=(good / duration if duration > 0 else 0.0) if slo is not None else None,
        good_share=(good / len(records) if records else None) if slo is not None else None,
        slo={k: v * 1000 for k, v in asdict(slo).items() if v is not None} if slo is not None else None,
        duration=duration,
        total_input_tokens=base.total_input_tokens,
        total_output_tokens=base.total_output_tokens,
        cached_tokens=base.cached_tokens,
        output_throughput=base.total_output_tokens / duration if duration > 0 and ok else None,
        max_in_flight=max_in_flight(records),
        length_mismatch=sum(
            1 for r, want in zip(records, requested_tokens, strict=True) if r.ok and r.completion_tokens != want
        ),
        ttft=base.ttft,
        tpot=base.tpot,
        itl=base.itl,
        e2el=base.e2el,
        server=server,
    )
