"""Stored history → summaries, comparison verdicts and exports, through a real SQLite store."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from sparkfleet.bench.client import RequestRecord
from sparkfleet.bench.report import compare, markdown, summarize, to_csv, to_json
from sparkfleet.bench.stats import decode_run_stats
from sparkfleet.bench.store import BenchStore
from sparkfleet.errors import BenchError
from sparkfleet.state.store import Store


def stream(start: float, gap: float, n: int = 11) -> RequestRecord:
    times = tuple(0.1 + i * gap for i in range(n))
    return RequestRecord(start, 0.1, 0.1, times, None, times[-1], times[-1], 50, n, 0, "length", None, "x")


def decode_run(bench: BenchStore, gaps: dict[tuple[str, int], list[float]], label: str) -> int:
    run_id = bench.create_run(
        "decode",
        "http://h:1",
        model="m",
        engine="vllm",
        engine_version="0.32.0",
        deployment=None,
        meta={"config": {"new_tokens": 11, "repeats": 3}},
        label=label,
    )
    for (ptype, conc), per_repeat in gaps.items():
        for rep, gap in enumerate(per_repeat):
            recs = tuple(stream(0.0, gap) for _ in range(conc))
            bench.add_sample(run_id, f"{ptype}/c{conc}", rep, decode_run_stats(recs, conc, 11), recs)
    bench.finish_run(run_id, "complete")
    return run_id


@pytest.fixture
def bench(tmp_path: Path) -> BenchStore:
    return BenchStore(Store(tmp_path / "state.db"))


def test_summary_medians_ranges_and_flag(bench: BenchStore) -> None:
    # c1 gaps 0.1 s → 10 tok/s per stream; c2 → 20 tok/s aggregate. json/c1 spreads 20 %.
    run_id = decode_run(
        bench,
        {("prose", 1): [0.1, 0.1, 0.1], ("prose", 2): [0.1, 0.1, 0.1], ("json", 1): [0.1, 0.09, 0.11]},
        "a",
    )
    tiers = summarize(bench.get_run(run_id), bench.samples(run_id))
    assert [t.tier for t in tiers] == ["prose/c1", "prose/c2", "json/c1"]
    prose1, prose2, json1 = tiers
    assert prose1.headline.median == pytest.approx(10.0)
    assert prose2.headline.median == pytest.approx(20.0)
    assert prose2.per_stream.median == pytest.approx(10.0)
    assert not prose1.flagged
    assert json1.flagged
    assert json1.headline.low == pytest.approx(1 / 0.11)
    # What `bench show` prints in a tier's last column.
    assert (prose1.flags(), json1.flags()) == ([], ["spread 20%"])
    assert replace(json1, failed=2, cached_tokens=64).flags() == ["spread 20%", "CACHED 64 tokens", "2 failed"]
    assert replace(prose1, kind="serve", foreign_requests=None).flags() == ["running count unknown"]


def test_compare_calls_a_difference_only_beyond_the_spread(bench: BenchStore) -> None:
    a = decode_run(bench, {("prose", 1): [0.100, 0.101, 0.099], ("prose", 2): [0.1, 0.1, 0.1]}, "a")
    b = decode_run(bench, {("prose", 1): [0.1005, 0.1, 0.1], ("prose", 2): [0.05, 0.05, 0.05]}, "b")
    ta = summarize(bench.get_run(a), bench.samples(a))
    tb = summarize(bench.get_run(b), bench.samples(b))
    rows = {r.tier: r for r in compare(ta, tb)}
    assert not rows["prose/c1"].exceeds_spread
    assert rows["prose/c2"].exceeds_spread
    assert rows["prose/c2"].ratio == pytest.approx(2.0)


def test_exports_carry_vllm_key_names_and_the_tables(bench: BenchStore) -> None:
    run_id = decode_run(bench, {("prose", 1): [0.1, 0.1], ("prose", 4): [0.1, 0.1]}, "x")
    run, samples = bench.get_run(run_id), bench.samples(run_id)
    tiers = summarize(run, samples)
    doc = json.loads(to_json(run, samples, tiers))
    sample = doc["samples"][0]
    for key in (
        "output_throughput",
        "median_ttft_ms",
        "p99_itl_ms",
        "mean_tpot_ms",
        "max_concurrency",
        "total_output_tokens",
        "completed",
    ):
        assert key in sample
    assert sample["median_ttft_ms"] == pytest.approx(100.0)
    assert len(sample["requests"]) == 1
    rows = list(csv.DictReader(io.StringIO(to_csv(run, tiers))))
    assert [r["tier"] for r in rows] == ["prose/c1", "prose/c4"]
    assert float(rows[1]["median"]) == pytest.approx(40.0)
    md = markdown(run, tiers)
    assert "| prose | 10.0 | 40.0 (10.0) |" in md


def test_partial_runs_say_so(bench: BenchStore) -> None:
    run_id = decode_run(bench, {("prose", 1): [0.1]}, "p")
    bench.finish_run(run_id, "partial", "interrupted by the user")
    run = bench.get_run(run_id)
    assert "PARTIAL: interrupted by the user" in markdown(run, summarize(run, bench.samples(run_id)))


def test_run_references(bench: BenchStore) -> None:
    first = decode_run(bench, {("prose", 1): [0.1]}, "1")
    second = decode_run(bench, {("prose", 1): [0.1]}, "2")
    assert bench.resolve("last") == second
    assert bench.resolve("last~1") == first
    assert bench.resolve(str(first)) == first
    with pytest.raises(BenchError, match="only 2 stored"):
        bench.resolve("last~5")
    with pytest.raises(BenchError, match="bad run reference"):
        bench.resolve("yesterday")
    with pytest.raises(BenchError, match="no bench run 99"):
        bench.get_run(99)


def test_a_one_percent_difference_inside_the_spread_is_not_called_real() -> None:
    # Measured back to back on vLLM CPU: the ranges just miss each other, the medians differ by
    # 1 %, far less than run A's 8 % range: within spread.
    from sparkfleet.bench.report import TierSummary
    from sparkfleet.bench.stats import Spread

    def tier(values: list[float]) -> TierSummary:
        empty = Spread.of(())
        s = Spread.of(values)
        return TierSummary("prose/c1", "decode", "prose", 1, None, len(values), s, empty, empty, empty, empty,
                           empty, empty, empty, 0, 0, 0, tuple(values))  # fmt: skip

    (row,) = compare([tier([41.45, 44.64, 44.82])], [tier([45.00, 45.10, 45.94])])
    assert not row.exceeds_spread
    (row,) = compare([tier([41.45, 44.64, 44.82])], [tier([50.0, 50.5, 51.0])])
    assert row.exceeds_spread
