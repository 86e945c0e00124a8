"""Helpers of ``benchmarks/gpu_device_run.sh`` (docs/gpu-run.md): capture what a real llama-server
says, and turn one run's captures into ``results.json`` and ``results.md``.

    capture.py health-trace URL OUT.json     every change of /health and /v1/models until ready
    capture.py streams URL MODEL DIR         raw SSE of a completion and a chat stream, and the
                                             server's /v1/models, /props, /health and /metrics
    capture.py deployment NAME DIR           the deployment's events and its rank 0 log/exit paths
    capture.py report DIR RESULTS            results.json + results.md from the captures in DIR

Standard library, httpx and sparkfleet only: it runs on the device machine.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

SMOKE_PROMPT = "The capital of France is Paris. The answer is 42"
BAR = 0.05  # sparkfleet's decode tok/s must be within 5 % of the server's own timings


# ---------------------------------------------------------------- captures on the device


def health_trace(url: str, out: Path, timeout: float = 400.0) -> None:
    """Poll /health and /v1/models every 20 ms; keep each change of answer (status and body)
    with its time, until /health has answered 200 for half a second."""
    base = url.rstrip("/")
    seen: dict[str, tuple[Any, str]] = {}
    trace: list[dict[str, Any]] = []
    start = time.monotonic()
    ready_at: float | None = None
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() - start < timeout:
            for path in ("/health", "/v1/models"):
                try:
                    response = client.get(base + path)
                    answer: tuple[Any, str] = (response.status_code, response.text[:600])
                except httpx.HTTPError as exc:
                    answer = (None, type(exc).__name__)
                if seen.get(path) != answer:
                    seen[path] = answer
                    status, text = answer
                    item = {"t": round(time.monotonic() - start, 4), "path": path, "status": status}
                    item["body" if status is not None else "error"] = text
                    trace.append(item)
                if path == "/health" and answer[0] == 200 and ready_at is None:
                    ready_at = time.monotonic()
            if ready_at is not None and time.monotonic() - ready_at > 0.5:
                break
            time.sleep(0.02)
    out.write_text(json.dumps(trace, indent=1) + "\n")


def _raw_stream(url: str, body: dict[str, Any]) -> bytes:
    # One connection per request: llama-server closes a connection after a stream, and a
    # reused one can be closed under the next request.
    with httpx.stream("POST", url, json=body, timeout=60.0) as response:
        return b"".join(response.iter_raw())


def streams(url: str, model: str, out: Path) -> None:
    """The server's answers, byte for byte, for fixtures: a streamed completion and chat (usage
    and timings in the final chunk), a plain completion, and its info routes."""
    base = url.rstrip("/")
    out.mkdir(parents=True, exist_ok=True)
    common = {"model": model, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    (out / "completions-stream.sse").write_bytes(
        _raw_stream(f"{base}/v1/completions", {**common, **usage, "prompt": SMOKE_PROMPT})
    )
    chat = [{"role": "user", "content": SMOKE_PROMPT}]
    (out / "chat-stream.sse").write_bytes(
        _raw_stream(f"{base}/v1/chat/completions", {**common, **usage, "messages": chat})
    )
    (out / "completions.json").write_bytes(
        httpx.post(f"{base}/v1/completions", json={**common, "prompt": SMOKE_PROMPT}, timeout=60.0).content
    )
    for name, path in (("models.json", "/v1/models"), ("props.json", "/props"), ("health-ok.json", "/health"),
                       ("metrics.txt", "/metrics")):  # fmt: skip
        (out / name).write_bytes(httpx.get(base + path, timeout=30.0).content)


def deployment(name: str, out: Path) -> None:
    """The deployment's recorded events and rank 0's log and exit-code paths."""
    from sparkfleet.state.deployments import Deployments

    records = Deployments()
    found = records.get(name)
    head = found.ranks[0] if found else None
    doc = {
        "status": found.status if found else None,
        "events": records.events(name, limit=100),
        "log_path": head.log_path if head else None,
        "exit_path": head.exit_path if head else None,
    }
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")


# ---------------------------------------------------------------- the report


def _load(path: Path) -> Any:
    """A capture's JSON, or None when the run stopped before it was written (or half way)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _csv_rows(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(path.read_text())) if row]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _records(sample: dict[str, Any]) -> list[Any]:
    from sparkfleet.bench.client import RequestRecord

    return [RequestRecord.from_json(r) for r in sample.get("requests") or ()]


def decode_figures(export: dict[str, Any]) -> dict[str, Any]:
    """Per tier and per concurrency: sparkfleet's figures and the server's own timings."""
    from sparkfleet.bench.stats import server_agreement

    tiers = []
    for t in export["tiers"]:
        row = {
            "tier": t["tier"], "concurrency": t["max_concurrency"], "runs": t["runs"],
            "aggregate_tps": (t["steady_output_throughput"] or {}).get("median"),
            "per_stream_tps": (t["per_stream_output_throughput"] or {}).get("median"),
            "ttft_ms": (t["median_ttft_ms"] or {}).get("median"),
            "tpot_ms": (t["median_tpot_ms"] or {}).get("median"),
            "failed": t["failed"], "length_mismatch": t["length_mismatch"], "spread": t["spread"],
        }  # fmt: skip
        tiers.append(row)
    pairs_by_conc: dict[int, list[tuple[float, float]]] = {}
    aggregate_by_conc: dict[int, list[float]] = {}
    tokens: list[tuple[int | None, float | None]] = []
    for sample in export["samples"]:
        conc = int(sample["tier"].rpartition("/c")[2])
        records = _records(sample)
        pairs = server_agreement(records)
        pairs_by_conc.setdefault(conc, []).extend(pairs)
        # The run's steady aggregate against the sum of the server's per-request decode rates.
        steady = sample.get("steady_output_throughput")
        if steady and pairs and len(pairs) == len(records):
            aggregate_by_conc.setdefault(conc, []).append(steady / sum(theirs for _, theirs in pairs))
        tokens += [(r.completion_tokens, (r.server_timings or {}).get("predicted_n")) for r in records if r.ok]
    by_conc = {}
    for conc in sorted({t["concurrency"] for t in tiers}):
        rows = [t for t in tiers if t["concurrency"] == conc]
        pairs = pairs_by_conc.get(conc, [])
        ratios = [ours / theirs for ours, theirs in pairs]
        by_conc[f"c{conc}"] = {
            "aggregate_tps": _median([t["aggregate_tps"] for t in rows if t["aggregate_tps"] is not None]),
            "per_stream_tps": _median([t["per_stream_tps"] for t in rows if t["per_stream_tps"] is not None]),
            "ttft_ms": _median([t["ttft_ms"] for t in rows if t["ttft_ms"] is not None]),
            "tpot_ms": _median([t["tpot_ms"] for t in rows if t["tpot_ms"] is not None]),
            # Over the very same requests: sparkfleet's per-stream figure and the server's own.
            "compared_per_stream_tps": _median([ours for ours, _ in pairs]),
            "server_per_stream_tps": _median([theirs for _, theirs in pairs]),
            "requests_compared": len(pairs),
            "ratio_median": _median(ratios),
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "max_deviation": max(abs(1 - r) for r in ratios) if ratios else None,
            "aggregate_ratios": aggregate_by_conc.get(conc, []),
        }
    deviations = [v["max_deviation"] for v in by_conc.values() if v["max_deviation"] is not None]
    return {
        "config": (export["run"].get("meta") or {}).get("config"),
        "exact_length": (export["run"].get("meta") or {}).get("exact_length"),
        "tiers": tiers,
        "by_concurrency": by_conc,
        "usage_equals_server_predicted_n": all(a == b for a, b in tokens) if tokens else None,
        "agreement_within_5pct": bool(deviations) and max(deviations) <= BAR,
    }


def prefill_figures(export: dict[str, Any]) -> dict[str, Any]:
    rows = []
    by_tier: dict[str, list[Any]] = {}
    for sample in export["samples"]:
        by_tier.setdefault(sample["tier"], []).extend(_records(sample))
    for t in export["tiers"]:
        records = by_tier.get(t["tier"], [])
        server = [(r.server_timings or {}) for r in records if r.ok]
        row = {
            "length": t["prompt_length"], "runs": t["runs"],
            "prompt_tokens": _median([r.prompt_tokens for r in records if r.prompt_tokens]),
            "prefill_tps": (t["prefill_throughput"] or {}).get("median"),
            "ttft_ms": (t["median_ttft_ms"] or {}).get("median"),
            "server_prompt_tps": _median([s["prompt_per_second"] for s in server if s.get("prompt_per_second")]),
            "server_prompt_n": _median([s["prompt_n"] for s in server if s.get("prompt_n")]),
            "cached_tokens": t["cached_tokens"], "failed": t["failed"],
        }  # fmt: skip
        rows.append(row)
    return {"tiers": rows, "overhead_ms": (export["run"].get("meta") or {}).get("overhead_ms")}


def _check(doctor: Any, check_id: str) -> str | None:
    for c in (doctor or {}).get("checks", ()):
        if c["id"] == check_id:
            return f"{c['status']}: {c['evidence']}"
    return None


def _text(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def report(captures: Path, results: Path) -> dict[str, Any]:
    results.mkdir(parents=True, exist_ok=True)
    dep = _load(captures / "deployment.json") or {}
    decode = _load(captures / "bench-decode.json")
    prefill = _load(captures / "bench-prefill.json")
    props = _load(captures / "props.json") or {}
    steps = [line.split("\t") for line in (_text(captures / "steps.tsv") or "").splitlines()]
    doctor_idle, doctor_serving = _load(captures / "doctor-idle.json"), _load(captures / "doctor-serving.json")
    doc: dict[str, Any] = {
        "gpu": {
            "idle": _csv_rows(captures / "gpu-idle.csv"),
            "serving": _csv_rows(captures / "gpu-serving.csv"),
            "apps_serving": _csv_rows(captures / "apps-serving.csv"),
            "after_down": _csv_rows(captures / "gpu-after.csv"),
        },
        "model": _load(captures / "model.json"),
        "server": {
            "build": props.get("build_info"),
            "n_ctx_slot": (props.get("default_generation_settings") or {}).get("n_ctx"),
        },
        "doctor_idle": {k: _check(doctor_idle, k) for k in ("gpu.present", "gpu.idle")},
        "doctor_serving": {k: _check(doctor_serving, k) for k in ("gpu.present", "gpu.idle")},
        "health_trace": _load(captures / "health-trace.json"),
        "events": [{"kind": e.get("kind"), "message": e.get("message")} for e in dep.get("events", [])],
        "status_serving": _load(captures / "status.json"),
        "status_after_down": _load(captures / "status-after.json"),
        "rank0_exit_code": _text(captures / "exit-code.txt"),
        "left_running": _text(captures / "left-running.txt"),
        "steps": [{"step": s[0], "seconds": float(s[1]), "rc": int(s[2])} for s in steps if len(s) == 3],
        "decode": decode_figures(decode) if decode else None,
        "prefill": prefill_figures(prefill) if prefill else None,
    }
    (results / "results.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (results / "results.md").write_text(markdown(doc))
    return doc


def _f(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(doc: dict[str, Any]) -> str:
    lines = ["# sparkfleet on a real GPU: llama.cpp llama-server (CUDA)", ""]
    gpu = doc["gpu"]
    if gpu["idle"]:
        lines.append(f"- GPU (nvidia-smi, idle): {', '.join(gpu['idle'][0])}")
    if gpu["serving"]:
        lines.append(f"- GPU while serving: {', '.join(gpu['serving'][0])}")
    for row in gpu["apps_serving"]:
        lines.append(f"- process on the GPU while serving: {', '.join(row)}")
    if gpu["after_down"]:
        lines.append(f"- GPU after down: {', '.join(gpu['after_down'][0])}")
    model = doc.get("model") or {}
    if model:
        lines.append(f"- model: {model.get('description')}")
    server = doc["server"]
    lines.append(f"- server: llama-server build {server['build']}, {server['n_ctx_slot']} tokens of context per slot")
    for when in ("doctor_idle", "doctor_serving"):
        for key, value in doc[when].items():
            lines.append(f"- {when.replace('_', ' ')} {key}: {value}")
    lines.append(f"- rank 0 exit code after down: {doc['rank0_exit_code']}; left running: {doc['left_running']}")
    for e in doc["events"]:
        if e["kind"] in ("healthy", "ready", "down"):
            lines.append(f"- event {e['kind']}: {e['message']}")
    trace = doc.get("health_trace") or []
    if trace:
        lines += ["", "## Health while loading (client-side trace)", "", "| t s | path | answer |", "|---|---|---|"]
        for item in trace:
            answer = f"{item['status']} {item.get('body', '')[:70]}" if item["status"] is not None else item["error"]
            lines.append(f"| {item['t']:.3f} | {item['path']} | {answer} |")
    decode = doc.get("decode")
    if decode:
        config = decode.get("config") or {}
        lines += ["", f"## Decode ({config.get('new_tokens')} new tokens, exact length; medians over "
                      f"{config.get('repeats')} runs, prompt types {', '.join(config.get('prompt_types') or ())})", "",
                  "| tier | aggregate tok/s | per stream tok/s | TTFT p50 ms | TPOT p50 ms |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for t in decode["tiers"]:
            lines.append(f"| {t['tier']} | {_f(t['aggregate_tps'])} | {_f(t['per_stream_tps'])} | "
                         f"{_f(t['ttft_ms'])} | {_f(t['tpot_ms'], 2)} |")  # fmt: skip
        lines += ["", "## sparkfleet against llama-server's own timings (same requests)", "",
                  "| concurrency | aggregate tok/s | requests | per stream, sparkfleet (median) | "
                  "per stream, server timings (median) | ratio per request, median (min–max) | max deviation |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for conc, v in decode["by_concurrency"].items():
            deviation = None if v["max_deviation"] is None else 100 * v["max_deviation"]
            lines.append(
                f"| {conc} | {_f(v['aggregate_tps'])} | {v['requests_compared']} | "
                f"{_f(v['compared_per_stream_tps'])} | "
                f"{_f(v['server_per_stream_tps'])} | {_f(v['ratio_median'], 4)} "
                f"({_f(v['ratio_min'], 4)}–{_f(v['ratio_max'], 4)}) | {_f(deviation, 2)} % |"
            )
        for conc, v in decode["by_concurrency"].items():
            agg = v.get("aggregate_ratios") or []
            if agg:
                lines.append(
                    f"\n{conc}: each run's aggregate tok/s / the sum of the server's per-request rates: "
                    f"median {_f(statistics.median(agg), 4)} ({_f(min(agg), 4)}–{_f(max(agg), 4)}), "
                    f"{len(agg)} runs"
                )
        same_tokens = decode["usage_equals_server_predicted_n"]
        lines += ["", f"Within 5 %: **{decode['agreement_within_5pct']}**; usage.completion_tokens == "
                      f"timings.predicted_n for every request: {same_tokens}"]  # fmt: skip
    prefill = doc.get("prefill")
    if prefill:
        lines += ["", f"## Prefill (cold, unique prefix; fixed overhead {_f(prefill['overhead_ms'])} ms)", "",
                  "| length | prompt tokens | prefill tok/s | TTFT p50 ms | server prompt tok/s |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for t in prefill["tiers"]:
            lines.append(f"| {t['length']} | {_f(t['prompt_tokens'], 0)} | {_f(t['prefill_tps'], 0)} | "
                         f"{_f(t['ttft_ms'])} | {_f(t['server_prompt_tps'], 0)} |")  # fmt: skip
    if doc["steps"]:
        lines += ["", "## Steps", "", "| step | seconds | rc |", "|---|---|---|"]
        lines += [f"| {s['step']} | {s['seconds']:.1f} | {s['rc']} |" for s in doc["steps"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    if command == "health-trace":
        health_trace(args[0], Path(args[1]))
    elif command == "streams":
        streams(args[0], args[1], Path(args[2]))
    elif command == "deployment":
        deployment(args[0], Path(args[1]))
    elif command == "report":
        report(Path(args[0]), Path(args[1]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
