"""The full quality run against the llama.cpp Gemma 3 270M example on this CPU: wall time and score.

Bar (issue 6): the whole run finishes in under 20 minutes and reports a score. Prints the wall
time, the score per category, the completion tokens generated, the median decode rate, and the
1-minute load average before and after (a busy machine slows the run; the figure says so).

    python benchmarks/eval_quality_cpu.py [--url http://127.0.0.1:18080]

Without ``--url`` it starts llama-cpp-python's server with the example recipe's arguments
(examples/gemma-llamacpp/recipe.toml: ``--n_ctx 4096 --model_alias gemma3-270m``) on a free port
(scripts/setup-engines.sh and scripts/prepare-model.py must have run) and stops it at the end.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from sparkfleet.config import caches
from sparkfleet.evals.client import EvalClient
from sparkfleet.evals.runner import run_quality
from sparkfleet.evals.tasks import load_tasks

CACHE = caches.engine_cache()
HUB = caches.hub_cache()


def start_llama() -> tuple[subprocess.Popen[bytes], str]:
    ggufs = glob.glob(str(HUB / "models--sparkfleet--gemma3-270m-gguf/snapshots/*/gemma-3-270m-Q4_K_M.gguf"))
    if not ggufs:
        sys.exit("no GGUF: run scripts/prepare-model.py")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [
        str(CACHE / "venv-llama/bin/python"),
        "-m",
        "llama_cpp.server",
        "--model",
        ggufs[0],
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "4096",
        "--model_alias",
        "gemma3-270m",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(1)
    sys.exit("llama.cpp server did not come up in 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    args = parser.parse_args()
    proc, url = (None, args.url) if args.url else start_llama()
    try:
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        load_before = os.getloadavg()[0]
        client = EvalClient(url, model)
        run = run_quality(client, load_tasks(), label="bench")
        client.close()
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
    tokens = sum(r.completion_tokens or 0 for r in run.results)
    print(f"full quality run: {run.passed}/{run.total} passed in {run.wall_s / 60:.1f} min (bar: < 20 min)")
    print("by category: " + ", ".join(f"{c} {p}/{n}" for c, (p, n) in run.by_category().items()))
    print(
        f"completion tokens {tokens}, median {run.median_tok_s() or 0:.1f} tok/s, "
        f"{run.truncated} answers cut at max_tokens; api {run.api}"
    )
    print(f"load average (1 min) before {load_before:.1f}, after {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
