"""`sparkfleet bench serve` end to end on the 2-node vLLM CPU deployment (tests/e2e/conftest.py):
open-loop arrivals at a rate, the engine's own /metrics read during the tier, a shared prefix
answered from vLLM's prefix cache, and the run's JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import VLLM_KEY

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_serve_on_vllm_reads_its_metrics_and_cached_prefix(vllm_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(tmp_path), "COLUMNS": "220"}
    key_file = tmp_path / "key"  # the deployment's key in a file of the user's, as a secrets manager leaves it
    key_file.write_text(VLLM_KEY + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "sparkfleet.cli.main", "bench", "serve", vllm_url, "--request-rate", "2",
         "--num-prompts", "8", "--discard-runs", "1", "--dataset-name", "prefix", "--prefix-len", "256",
         "--input-len", "32", "--output-len", "8", "--api", "completions", "--goodput", "ttft=30s",
         "--out", str(tmp_path / "run.json"), "--api-key", f"file:{key_file}"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "2/s" in out.stdout
    doc = json.loads((tmp_path / "run.json").read_text())
    (tier,) = doc["tiers"]
    assert doc["run"]["engine"] == "vllm" and doc["run"]["status"] == "complete"
    assert tier["request_rate"] == 2.0 and tier["achieved_rate"] > 1.0
    assert tier["failed"] == 0 and tier["length_mismatch"] == 0
    # Goodput counts the requests whose own TTFT met the 30 s SLO (on a loaded 2-core machine
    # CPU vLLM can miss it, so the share is read from the requests, not assumed to be all).
    sample = doc["samples"][0]
    good = sum(1 for r in sample["requests"] if r["error"] is None and r["ttft"] is not None and r["ttft"] <= 30.0)
    assert len(sample["requests"]) == 8
    assert tier["goodput"] == pytest.approx(tier["request_throughput"] * good / 8)
    # vLLM's own count of running requests was read and nothing else ran on it.
    assert sample["server"]["source"] == "metrics" and sample["server"]["polls"] > 0
    assert tier["foreign_requests"] == 0
    assert tier["kv_cache_usage_max"] is not None and tier["server_tpot_ms"] > 0
    # 7 of 8 requests find the 256-token system prompt in the prefix cache.
    assert tier["cached_tokens"] >= 7 * 128
    assert tier["prefix_cache_hit_rate"] > 0
