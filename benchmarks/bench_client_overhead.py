"""Client overhead: how many streamed tokens per second the bench client parses on one core.

A replay server in a separate process pre-renders a vLLM-shaped chat stream (one token per SSE
event, one HTTP chunk per event) and writes it as fast as the socket takes it; the client runs
``stream_request`` for every request, as ``bench decode`` does, and this script prints the tokens
it parsed per second of its own CPU time and of wall time. Bar: >= 50,000 tokens/s on one core,
so the client never limits a c16 run (16 streams x ~200 tok/s on a DGX Spark TP4 line is ~3,200).

    python benchmarks/bench_client_overhead.py [--tokens 4096] [--requests 40] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from sparkfleet.bench.client import RequestSpec, stream_request

BAR_TOKENS_PER_S = 50_000


async def run(url: str, tokens: int, requests: int, concurrency: int, api: str) -> tuple[int, float, float]:
    spec = RequestSpec(api=api, prompt="hello", max_tokens=tokens)  # type: ignore[arg-type]
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as client:
        await stream_request(client, url, "m", spec)  # warm the connection and caches

        async def one() -> int:
            async with sem:
                rec = await stream_request(client, url, "m", spec)
                if not rec.ok:
                    raise SystemExit(f"request failed: {rec.error}")
                return rec.completion_tokens or 0

        cpu0, wall0 = time.process_time(), time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(requests)))
        return sum(counts), time.process_time() - cpu0, time.perf_counter() - wall0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per request")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--api", choices=["chat", "completions"], default="chat")
    args = parser.parse_args()

    server_py = Path(__file__).resolve().parent.parent / "tests" / "replay_server.py"
    proc = subprocess.Popen([sys.executable, str(server_py), "--blast"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # the client gets one core
        total, cpu, wall = asyncio.run(
            run(f"http://127.0.0.1:{port}", args.tokens, args.requests, args.concurrency, args.api)
        )
    finally:
        proc.terminate()
        proc.wait(10)
    per_cpu = total / cpu if cpu > 0 else float("inf")
    per_wall = total / wall
    print(
        f"client parsed {total} tokens ({args.requests} requests x {args.tokens}, c{args.concurrency}, "
        f"{args.api}) in {wall:.2f} s wall, {cpu:.2f} s CPU"
    )
    print(f"tokens/s per CPU second: {per_cpu:,.0f}   tokens/s wall (one core): {per_wall:,.0f}")
    verdict = "PASS" if min(per_cpu, per_wall) >= BAR_TOKENS_PER_S else "FAIL"
    print(f"bar >= {BAR_TOKENS_PER_S:,} tokens/s on one core: {verdict}")


if __name__ == "__main__":
    main()
