"""What the gateway adds: the same client, in the same run, straight to a known-timing server, through
`sparkfleet gateway serve`, and through `sglang-router` (PyPI, Rust) as the anchor.

The server is tests/replay_server.py's ``--tick`` mode: a streamed answer of ``--tokens`` tokens,
one SSE event per token, ``--itl`` apart (1 ms: 1,000 chunks/s per stream), first token after
``--ttft``, every stream's events pre-rendered and written by one clock (the per-request mode's
sleep and JSON per event could not hold 1 ms beyond c16 on two cores). The client is aiohttp's on
uvloop, counting the events of each read and nothing more (the bench's httpx client parses every
event in Python, and at c64 the server sends 64,000 chunks/s), ``--rounds`` requests per stream
at concurrency 1, 16 and 64, the three paths taking turns level by level. Printed per path and
level: TTFT and inter-chunk gaps (p50/p99), the cores the proxy used meanwhile, and what the
gateway (and the router) add to direct. Answers of one length end on the same tick, so the 64
streams start again together; the row ``64~`` runs c64 again with the streams' starts spread over
one answer's length. Then what setting up a request costs each proxy: answers of 2 tokens at c64,
requests per second and the proxy's CPU per request.

Then the same three paths in front of a real engine: llama.cpp's ``llama-server`` (Gemma 3 270M, the
README's example, built by scripts/setup.sh) with 8 slots, ``--llama-tokens`` tokens per answer,
ignoring EOS, at concurrency 1, 4 and 8: beyond its slots a request's TTFT is its wait in the
engine's queue (65 s p50 direct at c64 in a run on two busy cores), which swamps what a proxy adds.
Skipped, with a line saying why, when the server or the model is missing.

Then the most streamed chunks per second each proxy carries on one core: the server pre-renders
its answers and writes them as fast as the socket takes them (``--blast``), the proxy is pinned to
one CPU, and chunks received by the clients are counted against the proxy's own CPU time.

The gateway runs with its defaults (loop detector on, request log on, no output cap so the server
decides the length). sglang-router needs a venv of its own (its FastAPI wants a newer Starlette
than the dashboard's): ``python -m venv .venv-router && .venv-router/bin/pip install sglang-router``.

    python benchmarks/gateway_overhead.py [--tokens 256] [--rounds 4] [--router-python .venv-router/bin/python]
        [--llama-server PATH] [--gguf PATH] [--llama-tokens 32] [--llama-rounds 8]

Bar (issue 33): added TTFT p50 <= 2 ms and p99 <= 10 ms at c64; added inter-chunk p50 <= 0.2 ms at
c16; >= 10,000 streamed chunks/s through the gateway on one core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
import numpy as np

from sparkfleet.config import caches

ROOT = Path(__file__).resolve().parents[1]
MODEL = "replay-model"
LEVELS = (1, 16, 64)
# Up to its 8 slots: beyond them a request's TTFT is its wait in the engine's queue (seconds at c16 on
# two cores), which swamps what a proxy adds.
LLAMA_LEVELS = (1, 4, 8)
_TOKEN = re.compile(rb'"content": ?" t')  # the replay server's tokens are " t0", " t1", ...
_TEXT = re.compile(rb'"content": ?"[^"]')  # llama-server: any event with text (its role chunk has none)
GGUF = (
    "models--sparkfleet--gemma3-270m-gguf/snapshots/7d24797f66ade612ee204c442bc36ff36e60edc0/"
    "gemma-3-270m-Q4_K_M.gguf"
)  # the README example's pinned snapshot
T = TypeVar("T")
PROXY_CPU = 0  # the proxies' core; the server and the client share the other


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree_cpu(pid: int) -> float:
    """CPU seconds of pid and its threads (and its children, for launchers that fork)."""
    total = cpu_seconds(pid)
    for child in Path("/proc").iterdir():
        if child.name.isdigit():
            try:
                stat = (child / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                total += cpu_seconds(int(child.name))
    return total


@contextmanager
def started(argv: list[str], ready: str, env: dict[str, str] | None = None, cpu: int | None = None,
            wait: float = 60) -> Iterator[tuple[subprocess.Popen[str], re.Match[str]]]:  # fmt: skip
    """A process whose output matches ``ready`` (a regex) once it serves; killed afterwards."""
    out = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115 - read while it runs
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, preexec_fn=pin)
    try:
        deadline = time.monotonic() + wait
        while True:
            m = re.search(ready, Path(out.name).read_text())
            if m:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{argv[:3]} did not start:\n{Path(out.name).read_text()[-2000:]}")
            time.sleep(0.05)
        yield proc, m
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(out.name)


def replay(args: argparse.Namespace, blast: bool) -> Iterator[tuple[subprocess.Popen[str], re.Match[str]]]:
    """The server (on the client's CPU in the throughput run, anywhere in the latency runs)."""
    argv = [sys.executable, str(ROOT / "tests" / "replay_server.py"), "--port", "0", "--itl", str(args.itl),
            "--ttft", str(args.ttft), "--tokens", str(args.blast_tokens if blast else args.tokens)]  # fmt: skip
    return started(argv + (["--blast"] if blast else ["--tick"]), r"PORT (\d+)", cpu=1 - PROXY_CPU if blast else None)


def gateway(upstream: str, state: Path, cpu: int | None) -> Iterator[tuple[subprocess.Popen[str], re.Match[str]]]:
    argv = [sys.executable, "-m", "sparkfleet.cli.main", "gateway", "serve", "--route", f"{MODEL}={upstream}",
            "--port", "0", "--max-new-tokens", "0"]  # fmt: skip
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(state), "COLUMNS": "300"}
    return started(argv, r"gateway on (http://\S+)/v1", env=env, cpu=cpu)


def router(python: str, upstream: str, cpu: int | None) -> Iterator[tuple[subprocess.Popen[str], re.Match[str]]]:
    port = free_port()
    argv = [python, "-m", "sglang_router.launch_router", "--worker-urls", upstream, "--host", "127.0.0.1",
            "--port", str(port), "--policy", "round_robin", "--log-level", "warn"]  # fmt: skip

    @contextmanager
    def run() -> Iterator[tuple[subprocess.Popen[str], re.Match[str]]]:
        with started(argv, r"", cpu=cpu) as (proc, _):
            answers(proc, f"http://127.0.0.1:{port}/v1/models", 60, "sglang-router did not start")
            yield proc, re.match(r"(.*)", f"http://127.0.0.1:{port}")  # type: ignore[misc]

    return run()


def answers(proc: subprocess.Popen[str], url: str, within: float, failed: str) -> None:
    """Wait until GET url answers 200 (exit with failed if proc ends or time runs out first)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(failed)
        time.sleep(0.2)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Record:
    """One streamed answer as the client saw it: when it was sent, and when each read that carried
    text arrived (with how many events it carried)."""

    start: float
    reads: list[tuple[float, int]] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.reads[0][0] - self.start

    @property
    def events(self) -> int:
        return sum(n for _, n in self.reads)

    def gaps(self) -> list[float]:
        """Inter-chunk times: a read carrying n events counts as n chunks, the first after the
        wait and the rest at 0 (as a client that parses them in turn sees them)."""
        out: list[float] = []
        prev = self.reads[0][0]
        for i, (t, n) in enumerate(self.reads):
            if i:
                out.append(t - prev)
            out += [0.0] * (n - 1)
            prev = t
        return out


async def one(session: aiohttp.ClientSession, url: str, tokens: int, real: bool = False) -> Record:
    """A streamed chat request; only counts the events (the client must not be the bottleneck:
    at c64 the server sends 64,000 chunks/s). ``real``: an engine, asked to ignore EOS, whose
    events may each carry more than one token's text."""
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": tokens,
                            "stream": True}  # fmt: skip
    if real:
        body.update(ignore_eos=True, temperature=0)
    pattern = _TEXT if real else _TOKEN
    rec = Record(time.perf_counter())
    tail = b""
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise SystemExit(f"{url}: HTTP {resp.status}: {(await resp.read())[:300]!r}")
        while True:
            data = await resp.content.readany()
            if not data:
                break
            # A token's text may straddle two reads: count over the previous read's tail too.
            seen = tail + data
            n = len(pattern.findall(seen)) - len(pattern.findall(tail))
            tail = seen[-16:]
            if n:
                rec.reads.append((time.perf_counter(), n))
    if rec.events != tokens and not (real and 0 < rec.events <= tokens):
        raise SystemExit(f"{url}: {rec.events} chunks, expected {tokens}")
    return rec


def session(concurrency: int, fresh: bool = False) -> aiohttp.ClientSession:
    """``fresh``: a new connection per request. llama-server has closed a kept-alive connection
    between two streamed answers (ServerDisconnectedError in a run), and aiohttp does not retry a
    POST on a connection found closed; a loopback connect then falls on every path alike."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency, force_close=fresh),
                                 timeout=aiohttp.ClientTimeout(total=300))  # fmt: skip


async def level(url: str, concurrency: int, requests: int, tokens: int, real: bool = False, spread: float = 0.0
                ) -> list[Record]:  # fmt: skip
    """``spread``: the streams start this many seconds apart in all (0: together, and answers of one
    length then end together and start again together)."""
    async with session(concurrency, fresh=real) as client:
        await asyncio.gather(*(one(client, url, tokens, real) for _ in range(concurrency)))  # warm the connections
        queue = list(range(requests))
        records: list[Record] = []

        async def worker(i: int) -> None:
            await asyncio.sleep(spread * i / concurrency)
            while queue:
                queue.pop()
                records.append(await one(client, url, tokens, real))

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return records


def run(coro: Coroutine[Any, Any, T]) -> T:
    """The client's loop: uvloop where installed (the gateway's own loop), so the client reads
    64,000 events/s at c64 with the least CPU taken from the server and the gateway."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def timed(url: str, pid: int | None, concurrency: int, requests: int, tokens: int, real: bool = False,
          spread: float = 0.0) -> tuple[dict[str, float], str]:  # fmt: skip
    """One path's figures at one level, and the cores its proxy used meanwhile (CPU s per wall s)."""
    cpu0, t0 = process_tree_cpu(pid) if pid else 0.0, time.perf_counter()
    f = figures(run(level(url, concurrency, requests, tokens, real, spread)))
    cores = (process_tree_cpu(pid) - cpu0) / (time.perf_counter() - t0) if pid else None
    return f, "" if cores is None else f"{cores:.2f}"


def figures(records: list[Record]) -> dict[str, float]:
    ttft = np.array([r.ttft for r in records]) * 1000
    gaps = np.array([g for r in records for g in r.gaps()]) * 1000
    return {"ttft_p50": float(np.percentile(ttft, 50)), "ttft_p99": float(np.percentile(ttft, 99)),
            "gap_p50": float(np.percentile(gaps, 50)), "gap_p99": float(np.percentile(gaps, 99))}  # fmt: skip


async def throughput(url: str, pid: int, streams: int, requests: int, tokens: int) -> tuple[float, float, float]:
    """(chunks per wall second, proxy CPU seconds, chunks per proxy CPU second)."""
    async with session(streams) as client:
        await one(client, url, tokens)
        queue = list(range(requests))
        chunks = 0

        async def worker() -> None:
            nonlocal chunks
            while queue:
                queue.pop()
                events = (await one(client, url, tokens)).events  # not `chunks += await …`: that reads chunks first
                chunks += events

        cpu0, t0 = process_tree_cpu(pid), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        wall, cpu = time.perf_counter() - t0, process_tree_cpu(pid) - cpu0
    return chunks / wall, cpu, chunks / cpu if cpu else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="tokens per answer in the latency runs")
    parser.add_argument("--itl", type=float, default=0.001, help="seconds between the server's chunks")
    parser.add_argument("--ttft", type=float, default=0.01, help="seconds before the server's first token")
    parser.add_argument("--rounds", type=int, default=4, help="requests per stream at each level")
    parser.add_argument("--blast-tokens", type=int, default=4096, help="tokens per answer in the throughput run")
    parser.add_argument("--router-python", default=str(ROOT / ".venv-router" / "bin" / "python"))
    parser.add_argument("--llama-server", default=str(caches.engine_cache() / "llama.cpp" / "bin" / "llama-server"))
    parser.add_argument("--gguf", default=str(caches.hub_cache() / GGUF))
    parser.add_argument("--llama-tokens", type=int, default=32, help="tokens per answer from llama-server")
    parser.add_argument("--llama-rounds", type=int, default=8, help="requests per stream at each level there")
    args = parser.parse_args()
    have_router = Path(args.router_python).exists()
    print(f"load average before: {os.getloadavg()}; cores: {os.cpu_count()}")
    print(f"server: {args.tokens} tokens per answer, {args.itl * 1000:g} ms apart, first after {args.ttft * 1000:g} ms")
    with tempfile.TemporaryDirectory() as state:
        with replay(args, blast=False) as (_, port):
            latencies(f"http://127.0.0.1:{port.group(1)}", Path(state) / "replay", args, args.tokens, args.rounds,
                      spread=args.ttft + args.tokens * args.itl)  # fmt: skip
        print("\nsetting up a request: answers of 2 tokens, 64 streams")
        setups(Path(state) / "setups", args)
        llama, gguf = Path(args.llama_server), Path(args.gguf)
        if llama.exists() and gguf.exists():
            print(
                f"\nllama-server ({gguf.name}, 8 slots): {args.llama_tokens} tokens per answer, EOS ignored,"
                f" levels {', '.join(map(str, LLAMA_LEVELS))}"
            )
            with llama_server(llama, gguf) as upstream:
                latencies(
                    upstream, Path(state) / "llama", args, args.llama_tokens, args.llama_rounds, LLAMA_LEVELS, real=True
                )
        else:
            missing = llama if not llama.exists() else gguf
            print(f"\n(no llama.cpp section: {missing} missing; scripts/setup.sh builds it)")
        print(f"\nthroughput: pre-rendered answers of {args.blast_tokens} chunks, 16 streams, the proxy pinned to CPU"
              f" {PROXY_CPU}, the server and the client to the other")  # fmt: skip
        os.sched_setaffinity(0, {1 - PROXY_CPU})
        with replay(args, blast=True) as (_, port):
            upstream = f"http://127.0.0.1:{port.group(1)}"
            runs = [("gateway", gateway(upstream, Path(state), PROXY_CPU))]
            if have_router:
                runs.append(("sglang-router", router(args.router_python, upstream, PROXY_CPU)))
            for name, ctx in runs:
                with ctx as (proc, m):
                    rate, cpu, per_cpu = run(throughput(m.group(1), proc.pid, 16, 64, args.blast_tokens))
                    print(f"{name:14} {rate:>9,.0f} chunks/s wall   {per_cpu:>9,.0f} chunks per proxy CPU second"
                          f"   ({cpu:.2f} CPU s)")  # fmt: skip
    if not have_router:
        print(f"(no sglang-router: {args.router_python} missing; see the docstring)")
    print(f"\nload average after: {os.getloadavg()}")


@contextmanager
def proxied(upstream: str, state: Path, args: argparse.Namespace) -> Iterator[dict[str, tuple[str, int | None]]]:
    """The paths to one server, by name: (URL, the proxy's pid or None)."""
    have_router = Path(args.router_python).exists()
    state.mkdir()
    with gateway(upstream, state, None) as (gp, gw), (
            router(args.router_python, upstream, None) if have_router else _none()) as rt:  # fmt: skip
        paths = {"direct": (upstream, None), "gateway": (gw.group(1), gp.pid)}
        if rt is not None:
            paths["sglang-router"] = (rt[1].group(1), rt[0].pid)
        yield paths


def latencies(upstream: str, state: Path, args: argparse.Namespace, tokens: int, rounds: int,
              levels: tuple[int, ...] = LEVELS, real: bool = False, spread: float = 0.0) -> None:  # fmt: skip
    """The table of one server: direct, through the gateway and through the router, level by level;
    ``spread`` > 0: the last level once more with the streams' starts that far apart (``~``)."""
    with proxied(upstream, state, args) as paths:
        print(f"\n{'path':14} {'conc':>4} {'reqs':>5} {'TTFT p50':>9} {'p99':>8} {'gap p50':>8} {'p99':>7}"
              f"  {'proxy CPU':>9}   added TTFT p50/p99, gap p50/p99 (ms)")  # fmt: skip
        runs = [(c, 0.0) for c in levels] + ([(levels[-1], spread)] if spread else [])
        for c, apart in runs:
            n = c * rounds
            got = {name: timed(url, pid, c, n, tokens, real, apart) for name, (url, pid) in paths.items()}
            base = got["direct"][0]
            shown = f"{c}~" if apart else str(c)
            for name, (f, cpu) in got.items():
                print(
                    f"{name:14} {shown:>4} {n:>5} {f['ttft_p50']:>9.2f} {f['ttft_p99']:>8.2f}"
                    f" {f['gap_p50']:>8.3f} {f['gap_p99']:>7.3f}  {cpu:>9}"
                    f"{_added(f, base) if name != 'direct' else ''}"
                )


def setups(state: Path, args: argparse.Namespace, rounds: int = 30) -> None:
    """What setting up a request costs each proxy: answers of 2 tokens, 64 streams, no wait for the
    first; requests per second, and the proxy's CPU per request."""
    short = argparse.Namespace(**{**vars(args), "tokens": 2, "ttft": 0.0})
    with replay(short, blast=False) as (_, port), proxied(f"http://127.0.0.1:{port.group(1)}", state, args) as paths:
        for name, (url, pid) in paths.items():
            run(level(url, 64, 64, 2))
            cpu0, t0 = process_tree_cpu(pid) if pid else 0.0, time.perf_counter()
            run(level(url, 64, 64 * rounds, 2))
            wall, cpu = time.perf_counter() - t0, process_tree_cpu(pid) - cpu0 if pid else 0.0
            per = f"   {cpu / (64 * rounds) * 1e6:>5.0f} µs of proxy CPU per request" if pid else ""
            print(f"{name:14} {64 * rounds / wall:>7,.0f} requests/s{per}")


@contextmanager
def llama_server(binary: Path, gguf: Path) -> Iterator[str]:
    port = free_port()
    argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", "8192", "-np", "8",
            "--alias", MODEL]  # fmt: skip
    with started(argv, r"listening on", wait=120) as (proc, _):
        url = f"http://127.0.0.1:{port}"
        # It listens before the model is loaded, answering 503 meanwhile.
        answers(proc, f"{url}/health", 120, "llama-server did not load the model")
        yield url


def _added(f: dict[str, float], base: dict[str, float]) -> str:
    d = {k: f[k] - base[k] for k in f}
    return f"   {d['ttft_p50']:+.2f} / {d['ttft_p99']:+.2f}, {d['gap_p50']:+.3f} / {d['gap_p99']:+.3f}"


@contextmanager
def _none() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    main()
