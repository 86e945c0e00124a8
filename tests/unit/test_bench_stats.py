"""The bench arithmetic on hand-built request records: every expected number worked out by hand."""

from __future__ import annotations

import pytest

from sparkfleet.bench.client import RequestRecord
from sparkfleet.bench.stats import (
    Spread,
    decode_run_stats,
    per_stream_tps,
    prefill_rate,
    prefill_sample,
    steady_throughput,
    steady_window,
    token_times,
)


def rec(
    start: float,
    first: float,
    n_chunks: int,
    gap: float,
    tokens: int | None = None,
    chunk_tokens: tuple[int, ...] | None = None,
    error: str | None = None,
    cached: int = 0,
    prompt_tokens: int = 100,
) -> RequestRecord:
    """A request sent at ``start`` whose chunks arrive at first, first+gap, … (relative)."""
    times = tuple(first + i * gap for i in range(n_chunks))
    return RequestRecord(
        start=start,
        ttfr=first,
        ttft=first if not error else None,
        chunk_times=times if not error else (),
        chunk_tokens=chunk_tokens,
        end=times[-1] if times and not error else None,
        done=(times[-1] if times else 0) + 0.001,
        prompt_tokens=prompt_tokens,
        completion_tokens=(tokens if tokens is not None else n_chunks) if not error else None,
        cached_tokens=cached,
        finish_reason="length",
        error=error,
    )


def test_per_stream_rate_excludes_the_first_token() -> None:
    # 11 tokens, one per 0.1 s after the first: 10 decode tokens in 1.0 s.
    assert per_stream_tps(rec(0.0, 0.5, 11, 0.1)) == pytest.approx(10.0)


def test_chunks_carrying_several_tokens_count_by_usage_not_by_chunks() -> None:
    # Speculative decoding: 5 chunks, 3 tokens each (usage says 15), 0.1 s apart.
    r = rec(0.0, 0.2, 5, 0.1, tokens=15)
    assert per_stream_tps(r) == pytest.approx(14 / 0.4)
    assert sum(k for _, k in token_times(r)) == pytest.approx(15)


def test_running_usage_places_tokens_on_the_chunks_that_carried_them() -> None:
    r = rec(10.0, 0.0, 3, 1.0, tokens=6, chunk_tokens=(1, 4, 1))
    assert token_times(r) == [(10.0, 1.0), (11.0, 4.0), (12.0, 1.0)]
    # Running usage that does not add up to the final usage is not trusted: spread evenly.
    bad = rec(10.0, 0.0, 3, 1.0, tokens=7, chunk_tokens=(1, 4, 1))
    assert [k for _, k in token_times(bad)] == pytest.approx([7 / 3] * 3)


def test_steady_window_is_where_every_stream_decodes() -> None:
    # Two streams: A decodes from 1.0 to 3.0, B (slower prefill) from 1.5 to 3.5.
    a = rec(0.0, 1.0, 21, 0.1)  # chunks 1.0 … 3.0
    b = rec(0.0, 1.5, 21, 0.1)  # chunks 1.5 … 3.5
    start, end, fell_back = steady_window([a, b], 2)
    assert (start, end, fell_back) == (pytest.approx(1.5), pytest.approx(3.0), False)
    tps, window, _ = steady_throughput([a, b], 2)
    # In (1.5, 3.0]: A's chunks 1.6…3.0 (15) and B's 1.6…3.0 (15) → 30 tokens / 1.5 s.
    assert window == pytest.approx(1.5)
    assert tps == pytest.approx(20.0)


def test_steady_window_with_replacement_requests() -> None:
    # c=1, three requests back to back: the window runs from the first request's first token
    # to the last request's last token.
    reqs = [rec(0.0, 0.5, 11, 0.1), rec(1.6, 0.5, 11, 0.1), rec(3.2, 0.5, 11, 0.1)]
    start, end, _ = steady_window(reqs, 1)
    assert (start, end) == (pytest.approx(0.5), pytest.approx(4.7))
    tps, _, _ = steady_throughput(reqs, 1)
    assert tps == pytest.approx(32 / 4.2)  # 33 tokens, the one opening the window excluded


def test_steady_window_falls_back_to_the_whole_span_and_says_so() -> None:
    # B's first token comes after A finished: no moment with both decoding.
    a = rec(0.0, 0.1, 3, 0.1)  # 0.1 … 0.3
    b = rec(0.0, 1.0, 3, 0.1)  # 1.0 … 1.2
    start, end, fell_back = steady_window([a, b], 2)
    assert fell_back
    assert (start, end) == (pytest.approx(0.1), pytest.approx(1.2))


def test_decode_run_stats_counts_failures_mismatches_and_vllm_throughput() -> None:
    good = rec(0.0, 0.2, 8, 0.05, tokens=8)
    short = rec(0.0, 0.2, 5, 0.05, tokens=5)  # engine stopped early
    failed = rec(0.0, 0.0, 0, 0.0, error="HTTP 500: boom")
    stats = decode_run_stats([good, short, failed], concurrency=3, requested_tokens=8)
    assert (stats.completed, stats.failed, stats.length_mismatch) == (2, 1, 1)
    assert stats.errors == ("HTTP 500: boom",)
    assert stats.total_output_tokens == 13
    # vLLM: output tokens / (last stream closed − first send) = 13 / (0.55 + 0.001).
    assert stats.output_throughput == pytest.approx(13 / 0.551)
    # TPOT = (E2E − TTFT) / (tokens − 1) = 0.05 s for both; ITL = chunk gaps = 0.05 s.
    assert stats.tpot.p50 == pytest.approx(50.0)
    assert stats.itl.p99 == pytest.approx(50.0)
    assert stats.ttft.mean == pytest.approx(200.0)


def test_percentiles_interpolate_like_numpy() -> None:
    reqs = [rec(0.0, t, 2, 0.01) for t in (0.1, 0.2, 0.3, 0.4)]
    stats = decode_run_stats(reqs, 4, 2)
    assert stats.ttft.p50 == pytest.approx(250.0)
    assert stats.ttft.p90 == pytest.approx(370.0)


def test_spread_flags_more_than_ten_percent() -> None:
    assert not Spread.of([100.0, 104.0, 109.0]).flagged
    s = Spread.of([100.0, 95.0, 106.0])
    assert (s.median, s.low, s.high) == (100.0, 95.0, 106.0)
    assert s.rel_spread == pytest.approx(0.11)
    assert s.flagged
    assert Spread.of([None, None]).median is None


def test_prefill_rate_subtracts_overhead_with_a_cap() -> None:
    assert prefill_rate(10_000, 1.05, 0.05) == pytest.approx(10_000.0)
    # An overhead above 80 % of TTFT is capped, so a noisy overhead cannot explode the rate.
    assert prefill_rate(1000, 0.1, 0.5) == pytest.approx(1000 / 0.02)


def test_prefill_sample_counts_only_uncached_tokens_and_reports_the_cache() -> None:
    r = rec(0.0, 1.05, 1, 0.0, tokens=1, cached=2000, prompt_tokens=12_000)
    sample = prefill_sample(r, 12_000, overhead=0.05)
    assert sample.cached_tokens == 2000
    assert sample.rate == pytest.approx(10_000.0)
