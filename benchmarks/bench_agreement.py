"""Agreement with ``vllm bench serve``, and repeatability, against one vLLM CPU server.

1. Side by side, same server, same prompts, same concurrency: for each tier, our client runs the
   workload, then vLLM's own benchmark (``vllm.benchmarks.serve.main``, the code behind
   ``vllm bench serve``, driven in one long-lived process of the vLLM venv so its 80 s import is
   paid once) runs the identical workload — completions endpoint (the test model is a base model
   without a chat template), ``--dataset-name custom`` with the same prompt texts,
   ``--ignore-eos``, temperature 0, the same number of prompts and ``--max-concurrency``, and a
   discarded warm-up wave on other prompts each. Every prompt starts with a fixed-width numeric
   nonce (``[run 0000000042]``), fresh per request, so neither tool is answered by the other's
   prefix cache and both send the same number of prompt tokens. Tools alternate per repeat to
   cancel drift, and each ratio is the median of the per-pair ratios. Printed: output tok/s
   (vLLM's definition: completion tokens / duration) and median TTFT from each, and the ratio.
   Bar: within 5 %. Run it on an otherwise idle machine: the server's speed is what is measured.
2. Repeatability: two back-to-back identical ``run_decode`` runs (our full method: warm-ups,
   repeats, steady-window aggregate); per tier, whether they agree within the spread they report.

    python benchmarks/bench_agreement.py [--url http://127.0.0.1:18400] [--tiers 1,2,4] [--tokens 48] [--repeats 7]

Without ``--url`` it starts the vLLM CPU server itself (scripts/setup-engines.sh and
scripts/prepare-model.py must have run; see docs/setup.md) and stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from sparkfleet.bench.client import RequestSpec
from sparkfleet.bench.corpus import load_prompts
from sparkfleet.bench.decode import DecodeConfig, run_concurrent, run_decode
from sparkfleet.bench.endpoint import Endpoint, resolve_endpoint
from sparkfleet.bench.report import compare, summarize
from sparkfleet.bench.stats import decode_run_stats
from sparkfleet.bench.store import BenchStore
from sparkfleet.config import caches
from sparkfleet.state.store import Store

CACHE = caches.engine_cache()
HUB = caches.hub_cache()
BAR = 0.05

# Runs inside the vLLM venv: reads one JSON list of `vllm bench serve` arguments per line,
# runs vllm.benchmarks.serve.main on it, answers one JSON line with the result. Only the JSONL
# reading of the custom dataset is replaced (pandas is not in that venv); request sending,
# timing and metrics are vLLM's own.
DRIVER = r"""
import json, random, sys, contextlib
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
from vllm.benchmarks.datasets import datasets as vllm_datasets

def load_jsonl(self):
    # CustomDataset.load_data reads the file with pandas, which the vLLM CPU venv lacks; this
    # reads the same JSONL into the same list of dicts and shuffles the same way.
    with open(self.dataset_path) as fh:
        self.data = [json.loads(line) for line in fh if line.strip()]
    random.seed(self.random_seed)
    if not getattr(self, "disable_shuffle", False):
        random.shuffle(self.data)

vllm_datasets.CustomDataset.load_data = load_jsonl
# PRELUDE
parser = FlexibleArgumentParser()
add_cli_args(parser)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    argv = json.loads(line)
    with contextlib.redirect_stdout(sys.stderr):
        result = main(parser.parse_args(argv))
    keep = {k: v for k, v in result.items() if isinstance(v, (int, float, str)) or v is None}
    print(json.dumps(keep), flush=True)
"""


def hf_snapshot() -> Path:
    snaps = sorted((HUB / "models--sparkfleet--gemma3-270m" / "snapshots").glob("*/"))
    if not snaps:
        raise SystemExit("no prepared model: run scripts/prepare-model.py with the vLLM venv (docs/setup.md)")
    return snaps[-1]


def vllm_python() -> Path:
    py = CACHE / "venv-vllm" / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"no vLLM venv at {py}: run scripts/setup-engines.sh vllm")
    return py


def start_server(port: int, max_len: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
    argv = [
        str(CACHE / "venv-vllm" / "bin" / "vllm"),
        "serve",
        str(hf_snapshot()),
        "--served-model-name",
        "gemma3-270m",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_len),
        "--dtype",
        "bfloat16",
        "--enable-prompt-tokens-details",
    ]
    print("starting:", " ".join(argv), flush=True)
    log = open(tempfile.gettempdir() + f"/bench-agreement-vllm-{port}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit("vLLM did not become ready in 600 s")


class VllmBench:
    """The long-lived driver process running vLLM's benchmark."""

    def __init__(self, prelude: str = "") -> None:
        """``prelude``: code run in the driver before its loop (e.g. a patch of vLLM's arrivals)."""
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
        self.log = Path(tempfile.gettempdir()) / "bench-agreement-vllm-driver.log"
        self.proc = subprocess.Popen(
            [str(vllm_python()), "-c", DRIVER.replace("# PRELUDE", prelude)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if not first:
            raise SystemExit(f"the vLLM benchmark driver failed to start; see {self.log}")

    def run(self, argv: list[str]) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the vLLM benchmark driver died; see {self.log}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(30)


class Prompts:
    """Prose prompts behind fixed-width numeric nonces, never reused."""

    def __init__(self) -> None:
        self.texts = load_prompts()["prose"]
        self.n = 0

    def take(self, count: int) -> list[str]:
        """The i-th prompt of every batch has the same body; only the nonce differs."""
        out = []
        for i in range(count):
            self.n += 1
            out.append(f"[run {self.n:010d}] {self.texts[i % len(self.texts)]}")
        return out


async def ours(endpoint: Endpoint, prompts: list[str], warm: list[str], conc: int, tokens: int) -> dict[str, float]:
    def spec(p: str) -> RequestSpec:
        return RequestSpec(
            api="completions",
            prompt=p,
            max_tokens=tokens,
            min_tokens=tokens,
            ignore_eos=True,
            continuous_usage=endpoint.engine == "vllm",
        )

    timeout = httpx.Timeout(600, connect=10)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=conc + 2)) as client:
        await run_concurrent(client, endpoint, [spec(p) for p in warm], conc)
        recs = await run_concurrent(client, endpoint, [spec(p) for p in prompts], conc)
    stats = decode_run_stats(recs, conc, tokens)
    assert stats.failed == 0, stats.errors
    return {
        "output_throughput": stats.output_throughput or 0.0,
        "median_ttft_ms": stats.ttft.p50 or 0.0,
        "total_input_tokens": stats.total_input_tokens,
        "total_output_tokens": stats.total_output_tokens,
    }


def theirs(
    driver: VllmBench, endpoint: Endpoint, prompts: list[str], warm: list[str], conc: int, tokens: int, workdir: Path
) -> dict:
    """vLLM's benchmark on ``prompts``, after a discarded warm-up wave on ``warm``.

    Its own ``--num-warmups`` re-sends the first measured prompt, which then finds itself in the
    prefix cache and lowers the measured TTFT; a separate warm-up run on other prompts does not.
    """
    vllm_run(driver, endpoint, warm, conc, tokens, workdir)
    return vllm_run(driver, endpoint, prompts, conc, tokens, workdir)


def vllm_run(
    driver: VllmBench,
    endpoint: Endpoint,
    prompts: list[str],
    conc: int | None,
    tokens: int,
    workdir: Path,
    rate: float = float("inf"),
    seed: int = 0,
) -> dict:
    """One ``vllm bench serve`` run; ``conc`` None = no concurrency cap, ``rate`` requests/s (Poisson)."""
    path = workdir / f"prompts-{prompts[0][5:15]}.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    argv = [
        "--backend",
        "openai",
        "--base-url",
        endpoint.base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        endpoint.model,
        "--tokenizer",
        str(hf_snapshot()),
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(path),
        "--custom-output-len",
        str(tokens),
        "--skip-chat-template",
        "--disable-shuffle",
        "--num-prompts",
        str(len(prompts)),
        *(["--max-concurrency", str(conc)] if conc else []),
        "--request-rate",
        str(rate),
        "--seed",
        str(seed),
        "--ignore-eos",
        "--temperature",
        "0",
        "--num-warmups",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
    ]
    return driver.run(argv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running vLLM server (default: start one)")
    parser.add_argument("--port", type=int, default=18450)
    parser.add_argument("--tiers", default="1,2,4")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--waves", type=int, default=2, help="requests per tier = concurrency x waves")
    parser.add_argument("--repeats", type=int, default=7, help="alternating repeats per tool")
    parser.add_argument("--skip-repeatability", action="store_true")
    parser.add_argument("--skip-agreement", action="store_true")
    args = parser.parse_args()
    tiers = [int(t) for t in args.tiers.split(",")]

    server = None if args.url else start_server(args.port, 4096)
    drivers: list[VllmBench | None] = [None]
    url = args.url or f"http://127.0.0.1:{args.port}"
    try:
        endpoint = resolve_endpoint(url)
        print(f"server: {endpoint.model} at {url} ({endpoint.engine} {endpoint.engine_version})", flush=True)
        if not args.skip_agreement:
            t0 = time.monotonic()
            driver = drivers[0] = VllmBench()
            print(f"vLLM benchmark driver ready in {time.monotonic() - t0:.0f} s", flush=True)
            prompts = Prompts()
            rows = []
            with tempfile.TemporaryDirectory() as tmp:
                for conc in tiers:
                    mine, vllm_runs = [], []
                    for rep in range(args.repeats):
                        n = conc * args.waves
                        order = ("ours", "vllm") if rep % 2 == 0 else ("vllm", "ours")
                        for tool in order:
                            batch, warm = prompts.take(n), prompts.take(conc)
                            if tool == "ours":
                                mine.append(asyncio.run(ours(endpoint, batch, warm, conc, args.tokens)))
                            else:
                                vllm_runs.append(theirs(driver, endpoint, batch, warm, conc, args.tokens, Path(tmp)))
                        m, v = mine[-1], vllm_runs[-1]
                        print(
                            f"c{conc} repeat {rep + 1}: ours {m['output_throughput']:.2f} tok/s "
                            f"TTFT {m['median_ttft_ms']:.0f} ms | vllm bench serve "
                            f"{v['output_throughput']:.2f} tok/s TTFT {v['median_ttft_ms']:.0f} ms "
                            f"(input tokens {m['total_input_tokens']} vs {v['total_input_tokens']}, "
                            f"output {m['total_output_tokens']} vs {v['total_output_tokens']})",
                            flush=True,
                        )
                    rows.append((conc, mine, vllm_runs))
            driver.close()

            print(
                "\nAgreement with vllm bench serve. Ratio = ours / vLLM, taken per alternating pair (ours and"
                " vLLM back to back), median over the pairs: pairing cancels the drift of a busy machine."
                " The ratio of the two medians is shown too."
            )
            worst = agreement_table([(f"c{conc}", mine, vllm_runs) for conc, mine, vllm_runs in rows], "tier")
            print(
                f"bar: output tok/s and median TTFT within {BAR:.0%} of vllm bench serve: "
                f"{'PASS' if worst <= BAR else 'FAIL'} (largest deviation {worst:.1%})",
                flush=True,
            )

        if not args.skip_repeatability:
            repeatability(endpoint, tiers, args.tokens)
    finally:
        if drivers[0] is not None and drivers[0].proc.poll() is None:
            drivers[0].proc.kill()
        if server is not None:
            server.terminate()
            server.wait(60)


def agreement_table(rows: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]], head: str) -> float:
    """Print ours against vLLM's per row (output tok/s and median TTFT: the ratio per alternating
    pair, median over the pairs, and the ratio of the two medians); returns the largest deviation."""
    print(
        f"{head:>7} | {'ours tok/s':>10} | {'vLLM tok/s':>10} | {'ratio':>6} ({'of med':>6}) | "
        f"{'ours TTFT ms':>12} | {'vLLM TTFT ms':>12} | {'ratio':>6} ({'of med':>6}) | verdict"
    )
    worst = 0.0
    for label, mine, vllm_runs in rows:
        pairs = list(zip(mine, vllm_runs, strict=True))
        tps = [(float(m["output_throughput"]), float(v["output_throughput"])) for m, v in pairs]
        ttft = [(float(m["median_ttft_ms"]), float(v["median_ttft_ms"])) for m, v in pairs]
        a, b = statistics.median(x for x, _ in tps), statistics.median(y for _, y in tps)
        ta, tb = statistics.median(x for x, _ in ttft), statistics.median(y for _, y in ttft)
        r1 = statistics.median(x / y for x, y in tps)
        r2 = statistics.median(x / y for x, y in ttft)
        worst = max(worst, abs(r1 - 1), abs(r2 - 1))
        ok = "within 5 %" if max(abs(r1 - 1), abs(r2 - 1)) <= BAR else "OUTSIDE 5 %"
        print(
            f"{label:>7} | {a:10.2f} | {b:10.2f} | {r1:6.3f} ({a / b:6.3f}) | {ta:12.1f} | {tb:12.1f} | "
            f"{r2:6.3f} ({ta / tb:6.3f}) | {ok}"
        )
    return worst


def repeatability(endpoint: Endpoint, tiers: list[int], tokens: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bench = BenchStore(Store(Path(tmp) / "state.db"))
        config = DecodeConfig(
            concurrency=tuple(tiers), prompt_types=("prose",), new_tokens=tokens, repeats=3, api="completions"
        )
        ids = []
        for label in ("A", "B"):
            run_id = bench.create_run(
                "decode",
                endpoint.base_url,
                model=endpoint.model,
                engine=endpoint.engine,
                engine_version=endpoint.engine_version,
                deployment=None,
                meta={"config": {"new_tokens": tokens}},
                label=label,
            )

            def store(run, run_id=run_id):  # type: ignore[no-untyped-def]
                bench.add_sample(run_id, run.tier, run.repeat, run.stats, run.records)

            asyncio.run(run_decode(endpoint, config, on_run=store))
            bench.finish_run(run_id, "complete")
            ids.append(run_id)
        a, b = (summarize(bench.get_run(i), bench.samples(i)) for i in ids)
        print("\nRepeatability: two back-to-back identical `bench decode` runs (steady aggregate tok/s):")
        agree = True
        for row in compare(a, b):
            verdict = "DIFFERENT (beyond spread)" if row.exceeds_spread else "agree within spread"
            agree &= not row.exceeds_spread
            print(
                f"{row.tier:>10} | A {row.a.median:.2f} ({row.a.low:.2f}-{row.a.high:.2f}) | "
                f"B {row.b.median:.2f} ({row.b.low:.2f}-{row.b.high:.2f}) | B/A {row.ratio:.3f} | {verdict}"
            )
        print(f"bar: back-to-back runs agree within their spread: {'PASS' if agree else 'FAIL'}", flush=True)


if __name__ == "__main__":
    main()
