"""`sparkfleet bench` end to end against real engines serving Gemma 3 270M on CPU.

The servers are started here (docs/setup.md has the commands) from the venvs that
scripts/setup-engines.sh makes and the model scripts/prepare-model.py prepares; the tests skip,
saying why, when those are absent. ``SPARKFLEET_E2E_VLLM_URL`` points the vLLM tests at a server
already running (it must serve with ``--enable-prompt-tokens-details``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sparkfleet.bench.chat_api import HINT, refuses_chat
from sparkfleet.bench.client import RequestSpec, stream_request
from sparkfleet.bench.store import BenchStore
from sparkfleet.state.store import Store
from tests.e2e.conftest import VLLM_HEADERS, VLLM_KEY, VLLM_KEY_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def sparkfleet(*args: str, state: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env or {}), "SPARKFLEET_STATE_DIR": str(state), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "sparkfleet.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


def test_a_base_model_without_a_chat_template_is_one_line_naming_api_completions(vllm_url: str,
                                                                                 tmp_path: Path) -> None:  # fmt: skip
    # Gemma 3 270M's HF conversion carries no chat template: vLLM refuses chat with HTTP 400 ...
    raw = httpx.post(
        f"{vllm_url}/v1/chat/completions",
        headers=VLLM_HEADERS,
        timeout=120,
        json={"model": "gemma3-270m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert raw.status_code == 400 and refuses_chat(f"HTTP 400: {raw.text}"), raw.text
    # ... and bench (default --api chat) stops in one line that names the way out.
    key = ("--api-key", f"env:{VLLM_KEY_ENV}")
    out = sparkfleet("bench", "decode", vllm_url, "--concurrency", "1", "--types", "prose", "--output-len", "4",
                     "--repeats", "1", "--warmups", "0", *key, state=tmp_path)  # fmt: skip
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert out.returncode == 2 and len(errors) == 1 and errors[0].endswith(f"({HINT})"), out.stderr
    # eval quality's --api auto takes the completions endpoint by itself.
    out = sparkfleet("eval", "quality", vllm_url, "--only", "math_multiply", "--json", *key, state=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["prompt_format"].startswith("completions:")


def test_decode_on_vllm_generates_exact_lengths_and_stores_everything(vllm_url: str, tmp_path: Path) -> None:
    out = sparkfleet(
        "bench",
        "decode",
        vllm_url,
        "--concurrency",
        "1,2",
        "--types",
        "prose,json",
        "--output-len",
        "16",
        "--repeats",
        "2",
        "--warmup-tokens",
        "4",
        "--label",
        "e2e",
        "--api",
        "completions",
        "--api-key",
        f"env:{VLLM_KEY_ENV}",
        state=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "prose/c2" in out.stdout
    bench = BenchStore(Store(tmp_path / "state.db"))
    run = bench.get_run(1)
    assert (run.status, run.engine, run.model, run.label) == ("complete", "vllm", "gemma3-270m", "e2e")
    assert run.engine_version == "0.32.0"
    assert run.meta["exact_length"]["enforced"] is True
    models = httpx.get(f"{vllm_url}/v1/models", headers=VLLM_HEADERS).json()
    assert run.meta["max_model_len"] == models["data"][0]["max_model_len"]
    assert run.meta["sparkfleet"].startswith("0.1.0")
    samples = bench.samples(1)
    assert sorted({s.tier for s in samples}) == ["json/c1", "json/c2", "prose/c1", "prose/c2"]
    assert len(samples) == 8
    for s in samples:
        assert s.metrics["failed"] == 0 and s.metrics["length_mismatch"] == 0
        assert s.metrics["steady_tps"] > 0 and s.metrics["per_stream_tps"] > 0
        assert s.metrics["cached_tokens"] == 0
        for r in s.requests:
            assert r.completion_tokens == 16  # from usage, not chunks
            assert r.ttft is not None and r.ttfr is not None and r.ttft >= r.ttfr
            assert r.chunk_tokens is not None and sum(r.chunk_tokens) == 16  # running usage
    # Exports of the same run.
    md = sparkfleet("bench", "export", "last", "-f", "md", state=tmp_path)
    assert "| prose |" in md.stdout and "| json |" in md.stdout
    doc = json.loads(sparkfleet("bench", "export", "1", "-f", "json", state=tmp_path).stdout)
    assert doc["samples"][0]["total_output_tokens"] in (16, 32)
    assert doc["run"]["meta"]["engine"] == "vllm"
    png = sparkfleet("bench", "export", "1", "-f", "png", "-o", str(tmp_path / "d.png"), state=tmp_path)
    assert png.returncode == 0, png.stderr
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"


def test_prefill_on_vllm_clips_to_context_and_nothing_is_cached(vllm_url: str, tmp_path: Path) -> None:
    ctx = httpx.get(f"{vllm_url}/v1/models", headers=VLLM_HEADERS).json()["data"][0]["max_model_len"]
    assert ctx < 64 * 1024
    # The key as the openai client takes it: OPENAI_API_KEY.
    out = sparkfleet("bench", "prefill", vllm_url, "--input-len", "512,1k,64k", "--repeats", "2", state=tmp_path,
                     env={"OPENAI_API_KEY": VLLM_KEY})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"exceed the context of {ctx} tokens" in out.stderr
    bench = BenchStore(Store(tmp_path / "state.db"))
    samples = bench.samples(1)
    assert sorted({int(s.tier) for s in samples}) == [512, 1024, ctx - 16]
    for s in samples:
        target = int(s.tier)
        # Fitted with vLLM's /tokenize; the count is the server's usage.prompt_tokens.
        assert target * 0.98 <= s.metrics["prompt_tokens"] <= target
        assert s.metrics["cached_tokens"] == 0
        assert s.metrics["rate"] > 0
    assert bench.get_run(1).meta["overhead_ms"] > 0


def test_vllm_reports_a_repeated_prompt_as_cached(vllm_url: str) -> None:
    # The flag the prefill bench relies on works on the real engine: same prompt twice → cached.
    spec = RequestSpec(api="completions", prompt="The history of the printing press. " * 40, max_tokens=1)

    async def twice():  # type: ignore[no-untyped-def]
        async with httpx.AsyncClient(timeout=120, headers=VLLM_HEADERS) as client:
            first = await stream_request(client, vllm_url, "gemma3-270m", spec)
            second = await stream_request(client, vllm_url, "gemma3-270m", spec)
            return first, second

    first, second = asyncio.run(twice())
    assert first.ok and second.ok
    assert (second.cached_tokens or 0) > 0


def test_llama_cpp_python_without_stream_usage_is_refused_with_the_reason(llama_url: str, tmp_path: Path) -> None:
    # llama-cpp-python's server sends no usage in streams; counting chunks instead is the flaw
    # this bench exists to avoid, so it says what is missing instead of guessing.
    out = sparkfleet(
        "bench",
        "decode",
        llama_url,
        "--concurrency",
        "1",
        "--types",
        "prose",
        "--output-len",
        "8",
        "--repeats",
        "1",
        "--api",
        "completions",
        state=tmp_path,
    )
    assert out.returncode == 2
    assert "(llama-cpp-python) reports no token usage in its streams" in out.stderr
    assert "Traceback" not in out.stderr
    # It measured nothing, so it stores nothing: no empty "partial" run per attempt.
    assert "kept as run" not in out.stderr
    show = sparkfleet("bench", "show", state=tmp_path)
    assert show.returncode == 0 and "decode" not in show.stdout, show.stdout
