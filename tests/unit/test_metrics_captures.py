"""The engines' real /metrics scrapes, read by the bench's parser (prometheus_client's), give the
figures each engine stated itself at the same moment (tests/fixtures/metrics/README.md: captured
by scripts/capture-metrics.py with three long streams running): running and waiting requests and
KV-cache use."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparkfleet.bench.server_metrics import KV_USAGE, RUNNING, WAITING, first, parse_prometheus, slots_kv_usage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
METRICS = FIXTURES / "metrics"


def _pair(engine: str) -> tuple[dict[str, float], str]:
    scrape, own = (METRICS / f"{engine}-metrics.txt").read_text(), (METRICS / f"{engine}-own.txt").read_text()
    return parse_prometheus(scrape), own


def test_vllm_scrape_matches_its_own_log_line() -> None:
    values, own = _pair("vllm")
    m = re.search(r"Running: (\d+) reqs, Waiting: (\d+) reqs, [GC]PU KV cache usage: ([0-9.]+)%", own)
    assert m is not None, own
    assert (first(values, RUNNING), first(values, WAITING)) == (float(m.group(1)), float(m.group(2))) == (3.0, 0.0)
    # The log prints one decimal; a few tokens are decoded between the line and the scrape.
    assert first(values, KV_USAGE) == pytest.approx(float(m.group(3)) / 100, abs=0.002)


def test_sglang_scrape_matches_its_own_decode_batch_line() -> None:
    values, own = _pair("sglang")
    running = re.search(r"#running-req: (\d+)", own)
    queued = re.search(r"#queue-req: (\d+)", own)
    usage = re.search(r"token usage: ([0-9.]+)", own)
    assert running and queued and usage, own
    assert (first(values, RUNNING), first(values, WAITING)) == (float(running.group(1)), float(queued.group(1)))
    assert first(values, RUNNING) == 3.0
    assert first(values, KV_USAGE) == pytest.approx(float(usage.group(1)), abs=0.01)


def test_native_llama_server_scrape_matches_its_slots() -> None:
    values, own = _pair("llama-cpp")
    slots = json.loads(own)
    busy = sum(1 for s in slots if s["is_processing"])
    assert first(values, RUNNING) == busy == 3
    assert first(values, WAITING) == 0.0  # 4 slots, 3 streams: nothing deferred
    # Today's llama-server exports no KV-cache gauge (its b4747 did: the next test); the bench reads
    # the same moment's /slots instead: slots 1 and 2 hold 12 + 3 tokens, slot 3 14 + 5, of 4 × 2048.
    assert first(values, KV_USAGE) is None
    assert slots_kv_usage(slots) == pytest.approx((15 + 15 + 19) / 8192)
    assert slots_kv_usage([{"id": 0}]) is None and slots_kv_usage({"error": "slots disabled"}) is None


def test_an_older_llama_server_kv_ratio_is_its_cached_tokens_over_its_context() -> None:
    # The H200 capture (llama.cpp b4747): kv_cache_usage_ratio is kv_cache_tokens over the whole
    # context, n_ctx per slot × total_slots from the same run's /props.
    capture = FIXTURES / "llama-server-h200"
    values = parse_prometheus((capture / "metrics.txt").read_text())
    props = json.loads((capture / "props.json").read_text())
    context = props["default_generation_settings"]["n_ctx"] * props["total_slots"]
    assert first(values, KV_USAGE) == pytest.approx(values["llamacpp:kv_cache_tokens"] / context, rel=1e-5)


def test_labels_with_braces_and_several_engines_are_read_right() -> None:
    # A `}` inside a label value broke the hand-written parser; prometheus_client reads it.
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="a}b"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="a}b"} 1.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="a}b"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="a}b"} 0.5\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="a}b"} 7.0\n'
        'vllm:prefix_cache_hits_created{engine="0",model_name="a}b"} 1.7e9\n'
    )
    values = parse_prometheus(text)
    assert values["vllm:num_requests_running"] == 3.0  # requests: summed over the engines
    assert values["vllm:kv_cache_usage_perc"] == 0.5  # a cache's use: the fullest, not 0.75
    assert values["vllm:prefix_cache_hits"] == 7.0 and "vllm:prefix_cache_hits_created" not in values
