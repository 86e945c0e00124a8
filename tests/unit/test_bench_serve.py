"""``bench serve`` against a server with known timing (tests/replay_server.py): the arrival
process the server saw, goodput at lax, impossible and splitting SLOs, foreign traffic flagged
from the engine's /metrics or its SGLang log, cached prefixes, multi-turn history, and the CLI's
tables, exports, comparison and bad-input lines."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sparkfleet.bench.arrivals import INF, Arrivals, parse_rates, schedule
from sparkfleet.bench.endpoint import resolve_endpoint
from sparkfleet.bench.serve import ServeBench, ServeConfig, ServeTierRun
from sparkfleet.bench.server_metrics import parse_prometheus, parse_running_log
from sparkfleet.bench.stats import SLO
from sparkfleet.bench.workload import Lengths, WorkloadConfig
from sparkfleet.errors import BenchError
from tests.cli_run import run_main
from tests.replay_server import ReplayServer, Script

SHORT = WorkloadConfig(input_len=Lengths(32, 32), output_len=Lengths(4, 4))


@pytest.fixture
def fast() -> Iterator[ReplayServer]:
    with ReplayServer(Script(base_ttft=0.01, itl=0.002)).running() as server:
        yield server


def bench(server: ReplayServer, **kw: Any) -> list[ServeTierRun]:
    cfg: dict[str, Any] = {"workload": SHORT, "discard_runs": 0, "api": "completions", "poll_interval": 0.1}
    return asyncio.run(ServeBench(resolve_endpoint(server.url), ServeConfig(**{**cfg, **kw})).run())


def cv(times: list[float]) -> float:
    gaps = [b - a for a, b in itertools.pairwise(sorted(times))]
    return statistics.pstdev(gaps) / statistics.mean(gaps)


def test_poisson_rate_is_met_within_10_percent_as_the_server_saw_it(fast: ReplayServer) -> None:
    (run,) = bench(fast, rates=(25.0,), requests=120)
    seen = fast.arrived[-120:]
    server_rate = (len(seen) - 1) / (seen[-1] - seen[0])
    assert run.stats.achieved_rate == pytest.approx(25.0, rel=0.10)
    assert server_rate == pytest.approx(25.0, rel=0.10)
    assert run.stats.request_throughput == pytest.approx(25.0, rel=0.10)
    # Poisson, not a metronome: exponential gaps spread (coefficient of variation near 1), and
    # only ~38 % fall within ±50 % of the mean gap, where even gaps put nearly all.
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert cv(seen) > 0.7
    assert sum(1 for g in gaps if 0.02 <= g <= 0.06) < 0.6 * len(gaps)
    assert run.stats.completed == 120 and run.stats.length_mismatch == 0


def test_constant_rate_and_concurrency_cap(fast: ReplayServer) -> None:
    (steady,) = bench(fast, rates=(20.0,), requests=30, burstiness=INF)
    # Even gaps: nearly all within ±50 % of 50 ms, where a Poisson process puts only ~38 % of
    # its gaps; a share, not a CV, so one stall of a busy machine cannot fail it.
    gaps = [b - a for a, b in itertools.pairwise(fast.arrived[-30:])]
    assert sum(1 for g in gaps if 0.025 <= g <= 0.075) >= 0.8 * len(gaps)
    assert steady.stats.process == "constant"
    # One slot and requests of ~20 ms each cannot carry 200/s: the achieved rate says so.
    with ReplayServer(Script(base_ttft=0.02, itl=0.01)).running() as slow:
        (capped,) = bench(slow, rates=(200.0,), requests=20, max_concurrency=1)
        assert slow.peak_streams == 1
    assert capped.stats.max_in_flight == 1
    assert capped.stats.achieved_rate is not None and capped.stats.achieved_rate < 40


def test_goodput_is_throughput_at_a_lax_slo_and_zero_at_an_impossible_one(fast: ReplayServer) -> None:
    (lax,) = bench(fast, rates=(30.0,), requests=40, slo=SLO(ttft=10.0, tpot=1.0, e2e=30.0))
    assert lax.stats.goodput == pytest.approx(lax.stats.request_throughput)
    assert lax.stats.good_share == 1.0
    (impossible,) = bench(fast, rates=(30.0,), requests=40, slo=SLO(ttft=1e-6))
    assert impossible.stats.goodput == 0.0 and impossible.stats.good_share == 0.0
    (none,) = bench(fast, rates=(30.0,), requests=10)
    assert none.stats.goodput is None


def test_goodput_counts_exactly_the_requests_that_meet_the_target() -> None:
    # Every third request waits 600 ms for its first token, the others 10 ms: a 300 ms TTFT
    # target keeps two thirds of them (with 290 ms to spare for a loaded machine: 150 ms was
    # passed by a 10 ms request while the rest of CI ran).
    counter = itertools.count()

    def script(body: dict[str, Any]) -> Script:
        return Script(base_ttft=0.6 if next(counter) % 3 == 0 else 0.01, itl=0.002)

    with ReplayServer(script).running() as server:
        # The exact-length probe is the server's request 0; the measured ones are 1..30.
        (run,) = bench(server, rates=(20.0,), requests=30, slo=SLO(ttft=0.3))
    slow = sum(1 for r in run.records if (r.ttft or 0) > 0.3)
    assert slow == 10
    assert run.stats.good_share == pytest.approx(20 / 30)
    assert run.stats.goodput == pytest.approx(20 / run.stats.duration)
    assert run.stats.ttft.p90 is not None and run.stats.ttft.p90 > 550


def _foreign(server: ReplayServer, start_after: float, n: int) -> threading.Thread:
    def send() -> None:
        time.sleep(start_after)

        def one() -> None:
            body = {"model": "replay-model", "prompt": "someone else's request", "max_tokens": 150, "stream": True}
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
                for _ in response.iter_raw():
                    pass

        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_a_tier_during_which_foreign_requests_run_is_flagged() -> None:
    with ReplayServer(Script(base_ttft=0.01, itl=0.01)).running() as server:
        (clean,) = bench(server, rates=(10.0,), requests=20)
        injector = _foreign(server, 0.3, 3)  # 3 requests of 150 tokens at 10 ms: 1.5 s each
        (dirty,) = bench(server, rates=(10.0,), requests=20)
        injector.join()
    assert clean.foreign_requests == 0
    assert clean.stats.server is not None and clean.stats.server["source"] == "metrics"
    assert dirty.foreign_requests == 3
    assert dirty.stats.server is not None and dirty.stats.server["running_max"] >= 3


def test_strict_aborts_on_foreign_traffic_and_keeps_what_was_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ReplayServer(Script(base_ttft=0.01, itl=0.01)).running() as server:
        injector = _foreign(server, 0.3, 2)
        code, _, err = run_main(capsys, "bench", "serve", server.url, "--request-rate", "10,20", "--num-prompts", "20",
                                "--discard-runs", "0", "--api", "completions", "--strict",
                                "--out", str(tmp_path / "run.json"))  # fmt: skip
        injector.join()
    assert code == 2
    assert "foreign traffic in the window" in err and "--strict" in err and "Traceback" not in err
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["run"]["status"] == "partial"
    assert [t["tier"] for t in doc["tiers"]] == ["10/s"]  # the 20/s tier never ran
    assert doc["tiers"][0]["foreign_requests"] == 2


def test_sglang_log_lines_tell_the_running_count_when_metrics_do_not(tmp_path: Path) -> None:
    log = tmp_path / "sglang.log"
    log.write_text("[2026-01-01 00:00:00] Decode batch. #running-req: 40, token usage: 0.50\n")  # before: ignored
    with ReplayServer(Script(base_ttft=0.01, itl=0.01, metrics=False)).running() as server:

        def write() -> None:
            # Once the bench sends (its log watch started before its first request): a fixed sleep
            # raced the bench's own start on a loaded machine, and lines before the watch are ignored.
            deadline = time.monotonic() + 30
            while len(server.bodies) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            with log.open("a") as fh:
                fh.write(
                    "[2026-01-01 00:00:01 TP0] Prefill batch. #new-seq: 1, #new-token: 12, #cached-token: 0, "
                    "token usage: 0.02, #running-req: 1, #queue-req: 0,\n"
                    "[2026-01-01 00:00:01 TP0] Decode batch. #running-req: 9, #token: 900, token usage: 0.07, "
                    "accept len: 2.40, cuda graph: True, gen throughput (token/s): 80.1, #queue-req: 0,\n"
                )

        writer = threading.Thread(target=write)
        writer.start()
        (run,) = bench(server, rates=(10.0,), requests=15, engine_log=str(log))
        writer.join()
    server_figs = run.stats.server
    assert server_figs is not None and server_figs["source"] == "log"
    assert server_figs["running_max"] == 9
    assert run.foreign_requests is not None and run.foreign_requests >= 5
    assert server_figs["kv_usage_max"] == pytest.approx(0.07)
    assert server_figs["spec_accept_length"] == pytest.approx(2.40)


def test_no_running_count_is_said_not_guessed() -> None:
    with ReplayServer(Script(base_ttft=0.01, itl=0.002, metrics=False)).running() as server:
        (run,) = bench(server, rates=(20.0,), requests=5)
        with pytest.raises(BenchError, match="--strict needs the engine's running-request count"):
            bench(server, rates=(20.0,), requests=5, strict=True)
    assert run.foreign_requests is None
    assert run.stats.server is not None and "no running-requests gauge" in str(run.stats.server["note"])


def test_prefix_dataset_reports_cached_tokens(fast: ReplayServer) -> None:
    workload = WorkloadConfig(dataset="prefix", prefix_len=64, input_len=Lengths(16, 16), output_len=Lengths(4, 4))
    (run,) = bench(fast, rates=(40.0,), requests=20, workload=workload, api="chat")
    systems = {b["messages"][0]["content"] for b in fast.bodies[-20:]}
    assert len(systems) == 1  # one shared system prompt, unique suffixes
    assert len({b["messages"][1]["content"] for b in fast.bodies[-20:]}) == 20
    # The replay server caches the first 64 characters (16 tokens) of a prompt seen before.
    assert run.stats.cached_tokens == 16 * 19
    assert run.stats.server is not None and run.stats.server["prefix_cache_hit_rate"] > 0


def test_multiturn_sends_the_real_answers_back(fast: ReplayServer) -> None:
    workload = WorkloadConfig(dataset="multiturn", turns=3, input_len=Lengths(16, 16), output_len=Lengths(3, 3))
    (run,) = bench(fast, rates=(20.0,), requests=4, workload=workload, api="chat")
    assert run.stats.requests == 12 and run.stats.arrivals == 4
    third = [b for b in fast.bodies[-12:] if len(b["messages"]) == 5]
    assert len(third) == 4
    assert [m["role"] for m in third[0]["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert third[0]["messages"][1]["content"] == " t0 t1 t2"  # what the server answered to turn 1


def test_dataset_file_is_sent_in_order_with_its_lengths(fast: ReplayServer, tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"prompt number {i}", "output_len": 2 + i}) + "\n" for i in range(3)))
    (run,) = bench(fast, rates=(50.0,), requests=6, workload=WorkloadConfig(dataset=str(path)))
    sent = [(b["prompt"], b["max_tokens"]) for b in fast.bodies[-6:]]
    assert sorted(sent) == sorted([(f"prompt number {i % 3}", 2 + i % 3) for i in range(6)])
    assert sorted(r.completion_tokens or 0 for r in run.records) == [2, 2, 3, 3, 4, 4]


def test_duration_bounds_the_tier(fast: ReplayServer) -> None:
    t0 = time.perf_counter()
    (run,) = bench(fast, rates=(30.0,), requests=None, duration=1.0)
    (closed,) = bench(fast, rates=(INF,), requests=None, duration=0.5, max_concurrency=2)
    assert time.perf_counter() - t0 < 4
    assert 15 <= run.stats.arrivals <= 45
    assert closed.stats.max_in_flight <= 2 and closed.stats.completed > 5


def test_schedule_is_vllms_normalised_gamma() -> None:
    offsets = schedule(Arrivals(4.0), 100, seed=3)
    assert offsets[-1] == pytest.approx(25.0)  # n / rate, exactly
    assert offsets == sorted(offsets)
    assert schedule(Arrivals(4.0), 100, seed=3) == offsets and schedule(Arrivals(4.0), 100, seed=4) != offsets
    assert schedule(Arrivals(INF), 3) == [0.0, 0.0, 0.0]
    assert parse_rates("1, 2.5,inf") == (1.0, 2.5, INF)


def test_prometheus_text_and_sglang_lines_parse() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 160.0\n'
        "vllm:kv_cache_usage_perc NaN\n"
    )
    values = parse_prometheus(text)
    assert values["vllm:num_requests_running"] == 5.0  # summed over engines
    assert values["vllm:prefix_cache_hits"] == 160.0 and "vllm:kv_cache_usage_perc" not in values
    lines = ["Decode batch. #running-req: 18, #token: 16384, token usage: 0.71, accept len: 2.40",
             "Decode batch. #running-req per DP: [2, 2], #queue-req: 0", "INFO: 200 OK"]  # fmt: skip
    assert parse_running_log(lines) == [(18, 0.71, 2.40)]


def test_cli_sweep_tables_exports_compare_and_plot(
    fast: ReplayServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "220")
    args = ("bench", "serve", fast.url, "--request-rate", "10,inf", "--num-prompts", "20", "--discard-runs", "1",
            "--input-len", "16:48", "--output-len", "4", "--api", "completions", "--max-concurrency", "4",
            "--goodput", "ttft=2s,tpot=100ms,e2e=5000")  # fmt: skip
    code, out, err = run_main(capsys, *args, "--out", str(tmp_path / "a.json"))
    assert code == 0, err
    assert "10/s" in out and "inf/s" in out and "goodput" in out and "discarded" not in out
    doc = json.loads((tmp_path / "a.json").read_text())
    tiers = {t["tier"]: t for t in doc["tiers"]}
    assert tiers["10/s"]["request_rate"] == 10.0 and tiers["inf/s"]["request_rate"] == "inf"
    for t in tiers.values():
        assert {"achieved_rate", "goodput", "foreign_requests", "p99_ttft_ms", "p90_tpot_ms", "p50_itl_ms",
                "p99_e2el_ms", "server_tpot_ms", "kv_cache_usage_max"} <= t.keys()  # fmt: skip
        assert t["foreign_requests"] == 0 and t["goodput"] == pytest.approx(t["request_throughput"])
    assert tiers["10/s"]["achieved_rate"] == pytest.approx(10.0, rel=0.15)
    assert doc["run"]["meta"]["config"]["slo"] == {"ttft": 2.0, "tpot": 0.1, "e2e": 5.0}
    assert len(doc["samples"]) == 2 and len(doc["samples"][0]["requests"]) == 20  # discarded run not stored

    code, _, err = run_main(capsys, *args, "--label", "b")
    assert code == 0, err
    code, out, err = run_main(capsys, "bench", "compare", "last~1", "last")
    assert code == 0, err
    assert "10/s" in out and "goodput" in out and "TTFT p50" in out
    code, out, _ = run_main(capsys, "bench", "export", "last", "-f", "md")
    assert code == 0 and "| 10/s |" in out and "achieved" in out
    pytest.importorskip("matplotlib")
    code, _, err = run_main(capsys, "bench", "export", "last", "-f", "png", "-o", str(tmp_path / "s.png"))
    assert code == 0, err
    assert (tmp_path / "s.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (("--request-rate", "0"), "--request-rate"),
        (("--request-rate", "fast"), "--request-rate"),
        (("--goodput", "ttft=soon"), "--goodput"),
        (("--goodput", "latency=1s"), "--goodput"),
        (("--burstiness", "-1"), "--burstiness"),
        (("--input-len", "512:128"), "--input-len"),
        (("--num-prompts", "10", "--duration", "5"), "--duration"),
        (("--dataset-name", "nope"), "--dataset-name"),
        (("--dataset-path", "missing.jsonl"), "--dataset-path"),
        (("--dataset-name", "custom"), "--dataset-path"),
        (("--request-rate", "inf", "--duration", "5"), "--max-concurrency"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(
    option: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(capsys, "bench", "serve", "http://127.0.0.1:9", *option)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
