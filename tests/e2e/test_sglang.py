"""The real SGLang 0.5.23 (CPU build, scripts/setup-engines.sh sglang) through `sparkfleet up`.

One node (examples/gemma-sglang on the local cluster): ready with a checked smoke answer, `bench
decode` whose tokens come from SGLang's streamed usage, `bench prefill` with the cached tokens
of `--enable-cache-report`, an `eval quality` subset, `logs`, and `down` with no SGLang process
left. Two nodes (examples/gemma-sglang-2node, TP2 over gloo on a loopback fleet of real sshd
nodes, each rank bound to its node's own address): both ranks up, the logs of both, a worker
killed after ready that `status` shows, `down` (head first: a worker ignores SIGTERM) with
nothing left on either node; and a worker killed during boot, which `up` rolls back, naming it.

Own deployment names (with this run's pid) and free ports: nothing here touches a user's
deployment or the examples' own ports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from sparkfleet.bench.store import BenchStore
from sparkfleet.config import caches
from sparkfleet.state.store import Store
from tests.e2e.conftest import CACHE, HUB, ROOT, RUN, _require, cli_at, free_ports, ok, up_in_background
from tests.e2e.test_engine_failures import rank_top_process
from tests.fleet import loopback_fleet
from tests.integration.conftest import leftover_processes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ONE = ROOT / "examples" / "gemma-sglang"
TWO = ROOT / "examples" / "gemma-sglang-2node"
SUBSET = "math_multiply,format_one_word,json_date_parts"


def _needs_sglang() -> None:
    _require(CACHE / "venv-sglang" / "bin" / "python", "the SGLang CPU venv")
    _require(HUB / "models--sparkfleet--gemma3-270m", "the Gemma HF conversion")


def test_sglang_one_node_serves_benches_evals_and_goes_down(tmp_path: Path) -> None:
    _needs_sglang()
    name = f"test-e2e-sglang-{RUN}"
    state = tmp_path / "state"
    port, rdv = free_ports(2)
    try:
        up = ok(cli_at(state, "up", str(ONE), "--name", name, "--set", f"port={port}",
                      "--set", f"rendezvous_port={rdv}"))  # fmt: skip
        assert f"ready {name}" in up and "Berlin" in up  # the smoke answer was checked
        status = json.loads(ok(cli_at(state, "status", name, "--json")))[0]
        endpoint = status["endpoint"]
        assert httpx.get(f"{endpoint}/v1/models", timeout=10).json()["data"][0]["id"] == "gemma3-270m"

        ok(cli_at(state, "bench", "decode", name, "--api", "completions", "--concurrency", "1,2", "--types", "prose",
                 "--output-len", "16", "--repeats", "2", "--warmup-tokens", "4", "--label", "sgl-decode"))  # fmt: skip
        bench = BenchStore(Store(state / "state.db"))
        run = next(r for r in bench.list_runs() if r.label == "sgl-decode")
        assert run.status == "complete" and run.engine == "sglang" and run.engine_version == "0.5.23"
        samples = bench.samples(run.id)
        assert sorted({s.tier for s in samples}) == ["prose/c1", "prose/c2"]
        for sample in samples:
            assert sample.metrics["failed"] == 0 and sample.metrics["steady_tps"] > 0
            # SGLang's stream carries usage: the counts are the server's, exactly as asked.
            assert sample.requests and all(r.completion_tokens == 16 for r in sample.requests)

        prefill = ok(cli_at(state, "bench", "prefill", name, "--input-len", "256", "--repeats", "2",
                           "--label", "sgl-prefill"))  # fmt: skip
        assert "prefill" in prefill
        run = next(r for r in bench.list_runs() if r.label == "sgl-prefill")
        # --enable-cache-report: SGLang reports cached prompt tokens in usage (its radix cache
        # holds at least the shared <bos> prefix on the second pass).
        assert any(s.metrics["cached_tokens"] > 0 for s in bench.samples(run.id))

        quality = ok(cli_at(state, "eval", "quality", name, "--only", SUBSET, "--label", "sgl-q"))
        assert "/3 passed" in quality and "completions" in quality

        logs = ok(cli_at(state, "logs", name))
        assert "The server is fired up and ready to roll!" in logs and "r0 local" in logs
    finally:
        down = cli_at(state, "down", name)
    assert down.returncode == 0, down.stderr
    assert leftover_processes(name) == []


def _wait_for_rank(name: str, rank: int, up: subprocess.Popen[str], err: Path, within: float = 300) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and up.poll() is None:
        pid = rank_top_process(name, rank)
        if pid is not None:
            return pid
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} never started:\n{err.read_text()[-3000:]}")


def test_sglang_two_nodes_serve_show_a_dead_worker_and_leave_nothing(tmp_path: Path) -> None:
    _needs_sglang()
    name = f"test-e2e-sglang2-{RUN}"
    state = tmp_path / "state"
    port, rdv = free_ports(2)
    with loopback_fleet(2, tmp_path / "fleet", shared_hf_cache=caches.local_hf_cache()) as fleet:
        cluster = str(fleet.cluster_file)
        try:
            up = ok(cli_at(state, "up", str(TWO), "--name", name, "--cluster", cluster,
                          "--set", f"port={port}", "--set", f"rendezvous_port={rdv}"))  # fmt: skip
            assert f"ready {name}" in up and "Berlin" in up
            ranks = json.loads(ok(cli_at(state, "status", name, "--json")))[0]["ranks"]
            assert [(r["rank"], r["node"], r["state"]) for r in ranks] == [
                (0, "node0", "running"),
                (1, "node1", "running"),
            ]
            assert ranks[0]["health"] == "healthy"
            logs = ok(cli_at(state, "logs", name))
            assert "r0 node0" in logs and "r1 node1" in logs

            # The worker dies after ready: status says so (never "running"), with its exit code.
            worker = rank_top_process(name, 1)
            assert worker is not None
            os.kill(worker, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                ranks = json.loads(cli_at(state, "status", name, "--json").stdout)[0]["ranks"]
                if ranks[1]["state"] != "running":
                    break
                time.sleep(1)
            assert ranks[1]["state"] == "exited", ranks
            assert "exit code -9" in ranks[1]["detail"], ranks  # SIGKILL, as the node's monitor saw it
        finally:
            down = cli_at(state, "down", name, timeout=300)
        assert down.returncode == 0, down.stderr
        assert leftover_processes(name) == [], "SGLang processes left on the nodes after down"


def test_sglang_worker_killed_during_boot_rolls_back_every_rank(tmp_path: Path) -> None:
    _needs_sglang()
    name = f"test-e2e-sglang-kill-{RUN}"
    port, rdv = free_ports(2)
    err_path = tmp_path / "up.err"
    with loopback_fleet(2, tmp_path / "fleet", shared_hf_cache=caches.local_hf_cache()) as fleet:
        sets = [f"port={port}", f"rendezvous_port={rdv}"]
        with up_in_background(name, TWO, fleet.cluster_file, sets, tmp_path / "state", err_path) as up:
            worker = _wait_for_rank(name, 1, up, err_path)
            _wait_for_rank(name, 0, up, err_path)  # the head runs too: the rollback must stop it
            time.sleep(5)
            assert up.poll() is None, f"up ended before the kill:\n{err_path.read_text()[-3000:]}"
            os.kill(worker, signal.SIGKILL)
            up.wait(timeout=600)
            left = leftover_processes(name)
    stderr = err_path.read_text()
    assert up.returncode == 2, stderr
    assert "rank 1 on node1 exited" in stderr and "during start-up" in stderr, stderr
    assert left == [], f"processes of {name} left after the rollback: {left}"
