"""llama.cpp's native llama-server, on what the real one said on an H200 (tests/fixtures/llama-server-h200,
captured by benchmarks/gpu_device_run.sh): the plan of the GPU recipe, its [verify] lines against the
real boot log, health 503 → 200 while loading, usage and timings in the final stream chunk, the
engine's detection, and sparkfleet's decode figures against the server's own timings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from sparkfleet.apply.observe import health_answer
from sparkfleet.apply.readiness import BootLog
from sparkfleet.bench.client import RequestRecord, _StreamParser
from sparkfleet.bench.endpoint import _context_length, detect_engine
from sparkfleet.bench.stats import per_stream_tps, server_agreement, server_decode_tps
from sparkfleet.config.cluster import local_cluster
from sparkfleet.config.recipe import load_recipe, parse_recipe
from sparkfleet.doctor.probes.gpu import parse_apps
from sparkfleet.plan.build import plan
from sparkfleet.plan.engines.llamacpp import NATIVE_READY_LOG

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "tests" / "fixtures" / "llama-server-h200"
GPU_RECIPE = ROOT / "benchmarks" / "gpu_run" / "llama-server-cuda"


def _capture(name: str) -> str:
    return (CAPTURES / name).read_text()


# ---------------------------------------------------------------- the plan


def test_the_gpu_recipe_plans_the_native_server_with_its_alias_and_health_route() -> None:
    planned = plan(load_recipe(GPU_RECIPE), local_cluster(), "llama-server-cuda")
    head = planned.head
    assert head.argv == (
        "/var/tmp/sparkfleet-gpu/build/bin/llama-server",
        "--model", "/var/tmp/sparkfleet-gpu/models/llama3-8b-f16.gguf",
        "-ngl", "999", "-np", "4", "-c", "65536", "-fa", "--metrics", "--alias", "llama3-8b-shape-random",
        "--host", "0.0.0.0", "--port", "18080",
    )  # fmt: skip
    assert planned.served_model == "llama3-8b-shape-random"
    assert (head.runtime, head.readiness.serves_http, head.readiness.health_path) == ("process", True, "/health")
    assert head.readiness.ready_log == NATIVE_READY_LOG


def test_an_alias_in_args_is_not_added_twice_and_the_python_server_gets_its_own_flag() -> None:
    base = {"engine": "llama-cpp", "model": "/m", "model_file": "g.gguf"}
    native = plan(parse_recipe({**base, "args": ["-a", "mine"]}, "r.toml"), local_cluster(), "g").head
    assert native.argv.count("-a") == 1 and "--alias" not in native.argv
    python = {**base, "entrypoint": ["python3", "-m", "llama_cpp.server"]}
    head = plan(parse_recipe(python, "r.toml"), local_cluster(), "g").head
    assert head.argv[head.argv.index("--model_alias") + 1] == "/m" and "--alias" not in head.argv
    # llama_cpp.server has no /health: /v1/models answers once the model is loaded.
    assert head.readiness.health_path == "/v1/models"
    named = plan(parse_recipe({**python, "args": ["--model_alias", "g3"]}, "r.toml"), local_cluster(), "g")
    assert named.head.argv.count("--model_alias") == 1 and named.served_model == "g3"


def test_the_verify_lines_are_in_the_real_boot_log_and_no_forbidden_line_is() -> None:
    recipe = load_recipe(GPU_RECIPE)
    boot = _capture("server-boot.log")
    for pattern in recipe.verify.expect:
        assert re.search(pattern, boot, re.MULTILINE), pattern
    assert re.search(NATIVE_READY_LOG, boot, re.MULTILINE)
    # The N/N backreference: every layer offloaded, not some.
    assert re.search(r"load_tensors: offloaded (\d+)/\1 layers to GPU", "load_tensors: offloaded 30/33 layers") is None
    whole = boot + _capture("server-stop.log")
    for pattern in recipe.verify.forbid:
        assert not re.search(pattern, whole, re.MULTILINE), pattern


# ---------------------------------------------------------------- health while loading


def test_health_503_while_loading_then_200_as_the_real_server_answered() -> None:
    trace = json.loads(_capture("health-trace.json"))
    health = [item for item in trace if item["path"] == "/health"]
    assert [item["status"] for item in health] == [None, 503, 200]  # refused, loading, ready
    assert health_answer(503, health[1]["body"]) == (False, "HTTP 503 Loading model")
    assert health_answer(200, health[2]["body"]) == (True, "HTTP 200")
    # /v1/models also answers 503 while loading, and its 200 lists the alias, not the file path.
    models = [item for item in trace if item["path"] == "/v1/models"]
    assert [item["status"] for item in models] == [None, 503, 200]
    assert json.loads(models[2]["body"])["data"][0]["id"] == "llama3-8b-shape-random"
    assert health_answer(500, "<html>oops</html>") == (False, "HTTP 500")


def test_the_boot_log_records_each_health_phase_once() -> None:
    boot = BootLog({"main: model loaded": "local rank 0"})
    for at, answer in ((0.1, "connection refused"), (0.6, "HTTP 503 Loading model"), (1.1, "HTTP 503 Loading model"),
                       (2.8, "HTTP 200")):  # fmt: skip
        boot.saw_health(at, answer)
    assert boot.describe() == (
        "rank 0 health: connection refused (0.1s) → HTTP 503 Loading model (0.6s) → HTTP 200 (2.8s); "
        "boot-log lines: 'main: model loaded' on local rank 0"
    )


# ---------------------------------------------------------------- streams


def _parse(api: str, stream: bytes, cut: int | None = None) -> RequestRecord:
    parser = _StreamParser(api)  # type: ignore[arg-type]
    if cut is None:
        parser.feed(stream, 1.0)
    else:
        parser.feed(stream[:cut], 1.0)
        parser.feed(stream[cut:], 2.0)
    return parser.record(0.0, 2.0)


def _final_chunk(stream: bytes) -> dict:
    events = [json.loads(line[5:]) for line in stream.splitlines() if line.startswith(b"data: {")]
    return events[-1]


@pytest.mark.parametrize(("name", "api"), [("completions-stream.sse", "completions"), ("chat-stream.sse", "chat")])
def test_usage_and_timings_come_from_the_final_chunk_that_still_has_a_choice(name: str, api: str) -> None:
    stream = (CAPTURES / name).read_bytes()
    final = _final_chunk(stream)
    # llama-server's form: one chunk with the finish_reason, empty text/delta, usage and timings.
    assert final["choices"][0]["finish_reason"] == "length" and "usage" in final and "timings" in final
    rec = _parse(api, stream)
    assert rec.ok and rec.finish_reason == "length"
    assert (rec.prompt_tokens, rec.completion_tokens) == (final["usage"]["prompt_tokens"], 8)
    assert len(rec.chunk_times) == 8  # the final chunk carries no text: not a generated chunk
    if api == "completions":
        assert rec.text == " 42" * 8  # the generated model repeats the prompt's last token
    assert rec.server_timings is not None
    assert rec.server_timings["predicted_n"] == 8
    assert rec.server_timings["predicted_per_second"] == pytest.approx(final["timings"]["predicted_per_second"])
    assert server_decode_tps(rec) == pytest.approx(final["timings"]["predicted_per_second"])


def test_the_real_stream_parses_the_same_cut_at_every_byte() -> None:
    stream = (CAPTURES / "completions-stream.sse").read_bytes()
    whole = _parse("completions", stream)
    for cut in range(1, len(stream)):
        rec = _parse("completions", stream, cut)
        assert (rec.completion_tokens, rec.text, rec.server_timings) == (
            whole.completion_tokens, whole.text, whole.server_timings)  # fmt: skip


def test_server_timings_survive_storage() -> None:
    rec = _parse("completions", (CAPTURES / "completions-stream.sse").read_bytes())
    back = RequestRecord.from_json(json.loads(json.dumps(rec.to_json())))
    assert back == rec
    old = {k: v for k, v in rec.to_json().items() if k != "server_timings"}  # a run stored before
    assert RequestRecord.from_json(old).server_timings is None


# ---------------------------------------------------------------- the engine, as the bench sees it


def test_the_bench_recognises_llama_server_and_its_per_slot_context() -> None:
    routes = {"/props": _capture("props.json"), "/v1/models": _capture("models.json")}

    def handler(request: httpx.Request) -> httpx.Response:
        body = routes.get(request.url.path)
        return httpx.Response(200, text=body) if body else httpx.Response(404)

    card = json.loads(routes["/v1/models"])["data"][0]
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        assert detect_engine(client, "http://x", card) == ("llama-cpp", "b0-unknown")
        # -c 65536 shared by -np 4 slots: each request gets 16384.
        assert _context_length(client, "http://x", card, "llama-cpp") == 16384


# ---------------------------------------------------------------- sparkfleet against the server's own timings


def _records(name: str) -> list[tuple[str, RequestRecord]]:
    export = json.loads(_capture(name))
    return [(s["tier"], RequestRecord.from_json(r)) for s in export["samples"] for r in s["requests"]]


def test_decode_tok_s_agrees_with_llama_server_timings_on_the_h200_run() -> None:
    records = _records("bench-decode-prose.json")
    assert {tier for tier, _ in records} == {"prose/c1", "prose/c4"} and len(records) == 3 + 3 * 4
    pairs = server_agreement(rec for _, rec in records)
    assert len(pairs) == len(records)
    for ours, theirs in pairs:
        # The server divides n tokens by the n - 1 steps after the first; sparkfleet n - 1 by the
        # time from the first chunk to the last: 255/256 = 0.9961, plus streaming jitter.
        assert 0.99 < ours / theirs <= 1.0
    for _, rec in records:
        assert rec.completion_tokens == 256 == (rec.server_timings or {})["predicted_n"]
    c1 = [per_stream_tps(rec) for tier, rec in records if tier == "prose/c1"]
    assert all(130 < (v or 0) < 170 for v in c1)  # an 8B-shaped f16 model at c1 on one H200


def test_prefill_prompt_tokens_from_usage_match_what_the_server_processed() -> None:
    records = [rec for _, rec in _records("bench-prefill.json") if rec.prompt_tokens and rec.prompt_tokens > 500]
    assert len(records) == 8
    for rec in records:
        timings = rec.server_timings or {}
        assert timings["prompt_n"] == rec.prompt_tokens  # a cold prefill: nothing came from the prompt cache


def test_the_gpu_process_while_serving() -> None:
    (proc,) = parse_apps(_capture("apps-serving.csv"))
    assert proc.name.endswith("/llama-server") and proc.used_mib == 23490


def test_the_captured_metrics_of_the_native_server_read_as_its_own_numbers() -> None:
    from sparkfleet.bench.server_metrics import KV_USAGE, RUNNING, WAITING, first, parse_prometheus

    values = parse_prometheus(_capture("metrics.txt"))
    # The capture's own lines: kv_cache_usage_ratio 0.00154114, requests_processing 0, deferred 0.
    assert first(values, KV_USAGE) == pytest.approx(0.00154114)
    assert (first(values, RUNNING), first(values, WAITING)) == (0.0, 0.0)
    assert values["llamacpp:tokens_predicted"] == 28  # a counter, its _total dropped
