"""The bench client and runners against a real HTTP server with scripted, known timing.

The replay server (tests/replay_server.py) streams over a real socket exactly like vLLM: role
chunk, tokens at a fixed interval, usage at the end. Every figure the runners report is then
known in advance: TTFT = base_ttft, per-stream rate = 1 / itl, aggregate = concurrency / itl,
prefill rate = the scripted prompt-token rate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sparkfleet.bench.client import RequestSpec, stream_request
from sparkfleet.bench.decode import DecodeConfig, run_decode
from sparkfleet.bench.endpoint import resolve_endpoint
from sparkfleet.bench.prefill import PrefillConfig, run_prefill
from sparkfleet.bench.store import BenchStore
from sparkfleet.errors import BenchError, NotFoundError
from sparkfleet.nodes.identity import Instance
from tests.replay_server import ReplayServer, Script

REPO = Path(__file__).resolve().parents[2]


def one(url: str, spec: RequestSpec):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        async with httpx.AsyncClient(timeout=30) as client:
            return await stream_request(client, url, "replay-model", spec)

    return asyncio.run(go())


def test_ttft_is_the_first_token_not_the_role_chunk() -> None:
    # The role chunk leaves at once; the first token 300 ms later.
    with ReplayServer(Script(base_ttft=0.3, itl=0.02, role_chunk_delay=0.0)).running() as srv:
        rec = one(srv.url, RequestSpec(api="chat", prompt="hi", max_tokens=10))
    assert rec.ok
    assert rec.ttfr is not None and rec.ttfr < 0.05
    assert 0.3 <= rec.ttft < 0.38
    assert rec.completion_tokens == 10
    assert rec.end == pytest.approx(0.3 + 9 * 0.02, abs=0.06)


def test_decode_figures_match_the_scripted_timing() -> None:
    script = Script(base_ttft=0.1, itl=0.02)
    with ReplayServer(script).running() as srv:
        endpoint = resolve_endpoint(srv.url)
        config = DecodeConfig(concurrency=(1, 4), prompt_types=("prose",), new_tokens=60, repeats=2, warmup_tokens=4)
        runs = asyncio.run(run_decode(endpoint, config))
    assert [(r.tier, r.repeat) for r in runs] == [
        ("prose/c1", 0),
        ("prose/c1", 1),
        ("prose/c4", 0),
        ("prose/c4", 1),
    ]
    for run in runs:
        s = run.stats
        assert s.completed == run.concurrency and s.failed == 0 and s.length_mismatch == 0
        # Tolerances leave room for a loaded 2-core CI box; counting errors would be 2x or more.
        assert s.per_stream_tps == pytest.approx(50.0, rel=0.08)
        assert s.steady_tps == pytest.approx(50.0 * run.concurrency, rel=0.08)
        # Never below the scripted 100 ms; above it only by HTTP and scheduling (a loaded CI box).
        assert 100.0 <= s.ttft.p50 < 160.0
        assert s.tpot.p50 == pytest.approx(20.0, rel=0.08)
        assert s.itl.p50 == pytest.approx(20.0, rel=0.1)


def test_speculative_chunks_are_counted_as_tokens_from_usage() -> None:
    # Three tokens per chunk, chunks 30 ms apart: 100 tok/s, not 33.
    with ReplayServer(Script(base_ttft=0.05, itl=0.03, tokens_per_chunk=3)).running() as srv:
        endpoint = resolve_endpoint(srv.url)
        config = DecodeConfig(concurrency=(2,), prompt_types=("code",), new_tokens=60, repeats=1, warmups=0)
        (run,) = asyncio.run(run_decode(endpoint, config))
    assert run.stats.total_output_tokens == 120
    assert run.stats.steady_tps == pytest.approx(200.0, rel=0.1)
    assert run.stats.itl.p50 == pytest.approx(30.0, rel=0.1)  # per chunk, as labelled


def test_an_engine_that_ignores_exact_length_is_detected_and_flagged() -> None:
    script = Script(base_ttft=0.01, itl=0.002, stop_early_at=5, honour_min_tokens=False)
    notes = []
    with ReplayServer(script).running() as srv:
        endpoint = resolve_endpoint(srv.url)
        config = DecodeConfig(concurrency=(2,), prompt_types=("json",), new_tokens=20, repeats=1, warmups=0)
        (run,) = asyncio.run(run_decode(endpoint, config, on_exact=notes.append))
    assert not notes[0].enforced
    assert "asked 16 tokens, got 5" in notes[0].note
    assert run.stats.length_mismatch == 2


def test_exact_length_is_asked_with_min_tokens_and_ignore_eos() -> None:
    with ReplayServer(Script(base_ttft=0.01, itl=0.001, stop_early_at=5)).running() as srv:
        endpoint = resolve_endpoint(srv.url)
        config = DecodeConfig(concurrency=(1,), prompt_types=("prose",), new_tokens=12, repeats=1, warmups=0)
        (run,) = asyncio.run(run_decode(endpoint, config))
        bodies = srv.bodies
    assert run.stats.length_mismatch == 0
    assert all(b["min_tokens"] == b["max_tokens"] and b["ignore_eos"] is True for b in bodies)
    assert all(b["temperature"] == 0.0 and b["stream_options"]["include_usage"] for b in bodies)
    prompts = [b["messages"][0]["content"] for b in bodies]
    assert len(set(prompts)) == len(prompts)  # a fresh nonce every time


def test_prefill_rate_recovers_the_scripted_rate_and_clips_to_context() -> None:
    # 20k prompt tokens/s on top of a 40 ms fixed overhead; context 20k.
    script = Script(base_ttft=0.04, prefill_rate=20_000, max_model_len=20_000)
    with ReplayServer(script).running() as srv:
        endpoint = resolve_endpoint(srv.url)
        assert endpoint.max_model_len == 20_000
        config = PrefillConfig(lengths=(4096, 16384, 65536), repeats=1)
        runs = asyncio.run(run_prefill(endpoint, config))
        bodies = srv.bodies
    assert [r.length for r in runs] == [4096, 16384, 19984]
    for run in runs:
        # The replay server counts len(prompt) // 4 tokens; /tokenize fitted the prompt.
        assert run.sample.prompt_tokens == pytest.approx(run.length, rel=0.01)
        assert run.sample.prompt_tokens <= run.length
        assert run.sample.cached_tokens == 0
        assert run.sample.rate == pytest.approx(20_000, rel=0.08)
    assert all(b["max_tokens"] == 1 for b in bodies)


def test_without_tokenize_prompts_are_sized_by_calibration_and_never_pre_sent() -> None:
    # Counting a prompt with a request would leave it in the prefix cache before it is measured.
    script = Script(base_ttft=0.01, prefill_rate=500_000, tokenize=False)
    with ReplayServer(script).running() as srv:
        endpoint = resolve_endpoint(srv.url)
        runs = asyncio.run(run_prefill(endpoint, PrefillConfig(lengths=(2048, 8192), repeats=1, warmup=False)))
    for run in runs:
        assert run.sample.cached_tokens == 0
        assert run.sample.prompt_tokens == pytest.approx(run.length, rel=0.02)


def test_a_cached_prompt_is_reported() -> None:
    with ReplayServer(Script(base_ttft=0.01)).running() as srv:
        spec = RequestSpec(api="completions", prompt="same prefix " * 20, max_tokens=1)
        first, second = one(srv.url, spec), one(srv.url, spec)
    assert first.cached_tokens == 0
    assert second.cached_tokens == 16


def test_endpoint_down_or_failing_is_a_clear_bench_error() -> None:
    with pytest.raises(BenchError, match="not answering"):
        resolve_endpoint("http://127.0.0.1:9")
    with ReplayServer(Script(status=500)).running() as srv:
        endpoint = resolve_endpoint(srv.url)
        with pytest.raises(BenchError, match="failed a probe request: HTTP 500: scripted failure"):
            asyncio.run(run_decode(endpoint, DecodeConfig(concurrency=(1,), repeats=1)))
    with (
        ReplayServer(Script()).running() as srv,
        pytest.raises(BenchError, match="does not serve model 'other'"),
    ):
        resolve_endpoint(srv.url, "other")


def test_a_server_that_fails_mid_run_keeps_the_earlier_tiers(tmp_path: Path) -> None:
    calls = {"n": 0}

    def script(body: dict) -> Script:  # type: ignore[type-arg]
        calls["n"] += 1
        return Script(base_ttft=0.01, itl=0.001, status=200 if calls["n"] <= 4 else 503)

    with ReplayServer(script).running() as srv:
        env = {**os.environ, "SPARKFLEET_STATE_DIR": str(tmp_path)}
        # probe, c1 warm-up, c1 run, c2 warm-up (2 requests) = 5th request fails: c2 tiers fail.
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "sparkfleet.cli.main",
                "bench",
                "decode",
                srv.url,
                "--concurrency",
                "1,2",
                "--types",
                "prose",
                "--output-len",
                "8",
                "--repeats",
                "1",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    assert proc.returncode == 2
    assert "every request of prose/c2 failed: HTTP 503" in proc.stderr
    assert "kept as run 1 (partial)" in proc.stderr
    from sparkfleet.state.store import Store

    bench = BenchStore(Store(tmp_path / "state.db"))
    run = bench.get_run(1)
    assert run.status == "partial"
    c1, c2 = bench.samples(1)
    assert (c1.tier, c1.metrics["completed"]) == ("prose/c1", 1)
    assert (c2.tier, c2.metrics["failed"]) == ("prose/c2", 2)


def test_ctrl_c_keeps_partial_results(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "replay_server.py"), "--itl", "0.05", "--ttft", "0.01"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        env = {**os.environ, "SPARKFLEET_STATE_DIR": str(tmp_path)}
        # c1 runs take ~0.5 s each; interrupt during the c2 tier.
        bench_proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sparkfleet.cli.main",
                "bench",
                "decode",
                f"http://127.0.0.1:{port}",
                "--concurrency",
                "1,2",
                "--types",
                "prose",
                "--output-len",
                "10",
                "--repeats",
                "6",  # long enough that the interrupt lands mid-run even on a slow machine
                "--warmups",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        from sparkfleet.state.store import Store

        bench = BenchStore(Store(tmp_path / "state.db"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if (tmp_path / "state.db").exists():
                try:
                    if len(bench.samples(1, with_requests=False)) >= 2:
                        break
                except BenchError:
                    pass
        bench_proc.send_signal(signal.SIGINT)
        _, err = bench_proc.communicate(timeout=30)
    finally:
        server.terminate()
        server.wait(10)
    assert bench_proc.returncode == 130, err
    assert "partial results kept as run 1" in err
    run = bench.get_run(1)
    assert run.status == "partial" and run.note == "interrupted by the user"
    assert {s.tier for s in bench.samples(1)} >= {"prose/c1"}
    assert dataclasses.asdict(run)["meta"]["config"]["new_tokens"] == 10


def test_a_deployment_name_resolves_to_its_endpoint_model_and_facts(tmp_path: Path) -> None:
    # The seed vLLM TP4 recipe planned on the 4-Spark example cluster and recorded as `up` does;
    # its endpoint is then pointed at the replay server, which plays the deployment's head.
    from sparkfleet.config.cluster import load_cluster
    from sparkfleet.config.recipe import load_recipe
    from sparkfleet.plan.build import plan
    from sparkfleet.state.deployments import Deployments
    from sparkfleet.state.store import Store

    store = Store(tmp_path / "state.db")
    recipe = load_recipe(REPO / "tests" / "data" / "seeds" / "dsv41-flash-eugr-0913-4x" / "recipe.toml")
    p = plan(recipe, load_cluster(REPO / "examples" / "clusters" / "spark4.toml"), "dsv41")
    records = Deployments(store)
    records.acquire(p, "spark4.toml", Instance.new(p.name))
    with pytest.raises(BenchError, match="'dsv41' is starting, not ready"):
        resolve_endpoint("dsv41", store=store)
    records.set_status("dsv41", "ready")
    with ReplayServer(Script(model="dsv41", owned_by="vllm")).running() as srv:
        with store.connect() as conn:
            conn.execute("UPDATE deployments SET endpoint = ? WHERE name = 'dsv41'", (srv.url + "/v1",))
        endpoint = resolve_endpoint("dsv41", store=store)
    assert endpoint.base_url == srv.url
    assert (endpoint.model, endpoint.engine, endpoint.deployment) == ("dsv41", "vllm", "dsv41")
    assert endpoint.meta["nodes"] == ["dgx1", "dgx2", "dgx3", "dgx4"]
    assert endpoint.meta["parallelism"]["tp"] == "4"
    assert "--speculative-config" in endpoint.meta["flags"]
    with pytest.raises(NotFoundError, match="no deployment named 'nope'"):
        resolve_endpoint("nope", store=store)
