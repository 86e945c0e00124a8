"""Capture an engine's /metrics at the moment it states the same figures itself, for the parser's
golden tests (tests/fixtures/metrics/). Run against a deployment sparkfleet started:

    .venv/bin/python scripts/capture-metrics.py NAME --engine vllm|sglang|llama-cpp --out DIR [--streams 3]

It keeps --streams long completions running, then polls every 0.3 s: the engine's /metrics, and
its own account of the same moment — vLLM's and SGLang's periodic log line of running and waiting
requests and KV-cache use (`sparkfleet logs NAME --rank 0`), llama-server's GET /slots. The first
poll whose own account shows every stream running is written: DIR/<engine>-metrics.txt (the raw
scrape) and DIR/<engine>-own.txt (the log line or the /slots answer it is checked against),
with DIR/<engine>-README.md saying when and how. Never edited afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

OWN_LINE = {
    "vllm": re.compile(r"Running: \d+ reqs, Waiting: \d+ reqs, GPU KV cache usage: [0-9.]+%"),
    "sglang": re.compile(r"Decode batch.*#running-req: \d+.*token usage: [0-9.]+.*#queue-req: \d+"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("--engine", required=True, choices=("vllm", "sglang", "llama-cpp"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=600)
    args = parser.parse_args()
    status = json.loads(_cli("status", args.name, "--json"))[0]
    url, model = status["endpoint"].rstrip("/"), status.get("served_model") or status.get("model")
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"} if os.environ.get("OPENAI_API_KEY") else {}
    model = model or httpx.get(f"{url}/v1/models", headers=headers).json()["data"][0]["id"]
    body = {"model": model, "prompt": "Write a long story about the sea.", "max_tokens": args.tokens,
            "ignore_eos": True, "temperature": 0, "stream": True}  # fmt: skip

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=600) as r:
            for _ in r.iter_raw():
                pass

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(args.streams)]
    for t in threads:
        t.start()
    seen = set(_own_lines(args))  # lines logged before the streams began do not count
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        scrape = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
        own = _own_now(args, url, headers, seen)
        if own is not None and _all_running(args.engine, own, args.streams):
            break
        if own is not None:
            seen.add(own)
        time.sleep(0.3)
    else:
        sys.exit("no poll saw every stream running in 300 s")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.engine}-metrics.txt").write_text(scrape)
    (args.out / f"{args.engine}-own.txt").write_text(own)
    print(f"{args.engine}: {own.strip()[:200]}")


def _cli(*words: str) -> str:
    return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *words], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def _own_lines(args: argparse.Namespace) -> list[str]:
    if args.engine == "llama-cpp":
        return []
    logs = _cli("logs", args.name, "--rank", "0", "--tail", "40")
    return [m.group(0) for line in logs.splitlines() if (m := OWN_LINE[args.engine].search(line))]


def _own_now(args: argparse.Namespace, url: str, headers: dict[str, str], seen: set[str]) -> str | None:
    if args.engine == "llama-cpp":
        return httpx.get(f"{url}/slots", headers=headers, timeout=10).text
    fresh = [line for line in _own_lines(args) if line not in seen]
    return fresh[-1] if fresh else None


def _all_running(engine: str, own: str, streams: int) -> bool:
    if engine == "llama-cpp":
        return sum(1 for s in json.loads(own) if s.get("is_processing")) == streams
    m = re.search(r"Running: (\d+)" if engine == "vllm" else r"#running-req: (\d+)", own)
    return m is not None and int(m.group(1)) == streams


if __name__ == "__main__":
    main()
