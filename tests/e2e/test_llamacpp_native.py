"""llama.cpp's own C++ servers through `sparkfleet up`: `llama-server` and `rpc-server`, built by
scripts/setup-engines.sh from the llama.cpp source that the llama-cpp-python sdist vendors.

One node (examples/gemma-llamacpp, the README's example, on the local cluster): ready with a
checked smoke answer, `bench decode` whose token counts are the server's own usage from its final
stream chunk, `bench serve` that reads KV-cache use from its `/metrics`, an `eval quality` subset,
and `down` with no llama-server left. Two nodes (examples/gemma-llamacpp-rpc-2node on a loopback
fleet of real sshd nodes): rank 0 `llama-server --rpc`, rank 1 `rpc-server`; up, bench, down with
nothing left on either node; the worker killed during boot (rolled back, naming it) and after
ready (status shows it).

Own deployment names (with this run's pid) and free ports: nothing here touches a user's
deployment or the examples' own ports.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from sparkfleet.bench.store import BenchStore
from sparkfleet.config import caches
from sparkfleet.state.store import Store
from tests.e2e.conftest import (
    CACHE,
    HUB,
    ROOT,
    RUN,
    _require,
    cli_at,
    free_ports,
    ok,
    up_in_background,
    wait_for_line,
    watching,
)
from tests.e2e.test_engine_failures import rank_top_process
from tests.fleet import loopback_fleet
from tests.integration.conftest import leftover_processes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ONE = ROOT / "examples" / "gemma-llamacpp"
TWO = ROOT / "examples" / "gemma-llamacpp-rpc-2node"
SUBSET = "math_multiply,format_one_word,json_date_parts"
BINARIES = ("llama-server", "rpc-server")


def _needs_native() -> None:
    _require(CACHE / "llama.cpp" / "bin" / "llama-server", "llama.cpp's llama-server")
    _require(CACHE / "llama.cpp" / "bin" / "rpc-server", "llama.cpp's rpc-server")
    _require(HUB / "models--sparkfleet--gemma3-270m-gguf", "the Gemma GGUF")


def _ours(name: str) -> list[str]:
    """The llama.cpp binaries of deployment name still running on this machine (every node)."""
    found = []
    for pid in leftover_processes(name):
        try:
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            continue
        if exe in BINARIES:
            found.append(f"{exe}[{pid}]")
    return found


def _bench_decode(state: Path, name: str, label: str) -> list[object]:
    ok(cli_at(state, "bench", "decode", name, "--api", "completions", "--concurrency", "1,2", "--types", "prose",
             "--output-len", "16", "--repeats", "2", "--warmup-tokens", "4", "--label", label))  # fmt: skip
    bench = BenchStore(Store(state / "state.db"))
    run = next(r for r in bench.list_runs() if r.label == label)
    assert run.status == "complete" and run.engine == "llama-cpp", run
    samples = bench.samples(run.id)
    assert sorted({s.tier for s in samples}) == ["prose/c1", "prose/c2"]
    for sample in samples:
        assert sample.metrics["failed"] == 0 and sample.metrics["steady_tps"] > 0
        # The native server's final chunk carries usage: exactly the tokens asked for.
        assert sample.requests and all(r.completion_tokens == 16 for r in sample.requests)
    return list(samples)


def test_native_llama_server_serves_benches_evals_and_goes_down(tmp_path: Path) -> None:
    _needs_native()
    name = f"test-e2e-llamanative-{RUN}"
    state = tmp_path / "state"
    port, rdv = free_ports(2)
    try:
        up = ok(
            cli_at(state, "up", str(ONE), "--name", name, "--set", f"port={port}", "--set", f"rendezvous_port={rdv}")
        )
        assert f"ready {name}" in up and "Berlin" in up  # the smoke answer was checked
        endpoint = json.loads(ok(cli_at(state, "status", name, "--json")))[0]["endpoint"]
        assert httpx.get(f"{endpoint}/health", timeout=10).json() == {"status": "ok"}
        assert _ours(name) and all(p.startswith("llama-server[") for p in _ours(name))

        _bench_decode(state, name, "native-decode")
        # The Gemma GGUF carries no chat template: llama-server frames chat in its ChatML fallback,
        # and bench says so in one line naming --api completions; --json keeps stdout for the run.
        chat = cli_at(state, "bench", "decode", name, "--concurrency", "1", "--types", "prose", "--output-len", "4",
                      "--repeats", "1", "--warmups", "0", "--json")  # fmt: skip
        assert chat.returncode == 0, chat.stderr[-3000:]
        hints = [line for line in chat.stderr.splitlines() if "--api completions" in line]
        assert len(hints) == 1 and "has no chat template of its own" in hints[0], chat.stderr[-3000:]
        assert json.loads(chat.stdout)["run"]["kind"] == "decode"

        serve = ["--request-rate", "8", "--num-prompts", "8", "--input-len", "64", "--output-len", "16"]
        ok(cli_at(state, "bench", "serve", name, "--api", "completions", *serve, "--discard-runs", "0",
                 "--label", "native-serve"))  # fmt: skip
        bench = BenchStore(Store(state / "state.db"))
        run = next(r for r in bench.list_runs() if r.label == "native-serve")
        (sample,) = bench.samples(run.id)
        # The server's own account, polled from its /metrics while the tier ran (llamacpp:requests_*),
        # and KV-cache use from its /slots (this llama.cpp exports no KV gauge; b4747's is read first).
        server = sample.metrics["server"]
        assert server["source"] == "metrics" and server["running_max"] >= 1, server
        assert 0 < server["kv_usage_max"] < 1, server

        quality = ok(cli_at(state, "eval", "quality", name, "--only", SUBSET, "--label", "native-q"))
        assert "/3 passed" in quality

        logs = ok(cli_at(state, "logs", name))
        assert "r0 local | " in logs and "stop processing" in logs  # the tail: the server's slots at work
    finally:
        down = cli_at(state, "down", name)
    assert down.returncode == 0, down.stderr
    assert _ours(name) == [] and leftover_processes(name) == []


def test_ab_of_a_keyed_recipe_benches_each_variant_with_its_key(tmp_path: Path) -> None:
    # Each round's up starts llama-server with the key (`--env LLAMA_API_KEY`, from ab's environment),
    # smoke-tests with it, and the decode bench reaches the deployment with its own key. A prober
    # asks the port without a key the whole time: every variant must refuse it (401) and answer
    # nothing without it, so a key that never reached the engine fails here too.
    _needs_native()
    recipe = tmp_path / "gemma-ab"
    shutil.copytree(ONE, recipe)
    (recipe / "recipe.toml").write_text((recipe / "recipe.toml").read_text()
                                        + '\n[variants.two-slots]\nargs_set = ["-np", "2"]\n')  # fmt: skip
    name, key, state = f"test-e2e-ab-keyed-{RUN}", "sk-ab-" + secrets.token_hex(16), tmp_path / "state"
    port, rdv = free_ports(2)
    report_file = tmp_path / "report.json"
    refused: list[int] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.wait(0.3):
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=5,
                               json={"model": "gemma3-270m", "prompt": "Hi", "max_tokens": 1})  # fmt: skip
            except httpx.HTTPError:
                continue  # between the variants: nothing listens
            refused.append(r.status_code)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "sparkfleet.cli.main", "ab", str(recipe), "--variants", "base,two-slots",
             "--rounds", "1", "--bench", "decode", "--concurrency", "1", "--output-len", "8", "--repeats", "1",
             "--warmups", "0", "--api", "completions", "--name", name, "--set", f"port={port}",
             "--set", f"rendezvous_port={rdv}", "--env", "LLAMA_API_KEY", "--out", str(report_file)],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, "SPARKFLEET_STATE_DIR": str(state), "LLAMA_API_KEY": key},
        )  # fmt: skip
    finally:
        stop.set()
        prober.join()
    assert out.returncode == 0, out.stderr[-3000:]
    assert _ours(name) == [] and leftover_processes(name) == []
    assert 401 in refused and set(refused) <= {401, 503}, refused  # 503: a variant still loading
    report = json.loads(report_file.read_text())
    decode = next(m for m in report["metrics"] if m["name"] == "decode prose/c1 tok/s")
    assert decode["a"] and decode["b"], decode  # both variants were benched through the key
    for text in (out.stdout, out.stderr, report_file.read_text()):
        assert key not in text
    for stored in state.rglob("*"):
        if stored.is_file():
            assert key.encode() not in stored.read_bytes(), stored


def test_rpc_two_nodes_serve_bench_show_a_dead_worker_and_leave_nothing(tmp_path: Path) -> None:
    _needs_native()
    name = f"test-e2e-llamarpc-{RUN}"
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
            assert sorted(p.split("[")[0] for p in _ours(name)) == ["llama-server", "rpc-server"]
            logs = ok(cli_at(state, "logs", name))
            assert "r0 node0" in logs and "r1 node1" in logs
            # rank 0 put part of the model on the worker's RPC device.
            assert f"{fleet.nodes[1].host}:{rdv}" in logs

            _bench_decode(state, name, "rpc-decode")

            # The worker dies after ready: status says so, and that the head cannot serve alone.
            worker = rank_top_process(name, 1)
            assert worker is not None
            os.kill(worker, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                status = json.loads(cli_at(state, "status", name, "--json").stdout)[0]
                if status["ranks"][1]["state"] != "running":
                    break
                time.sleep(1)
            assert status["ranks"][1]["state"] == "exited", status
            assert status["status"] == "degraded", status
            assert status["degraded_reason"].startswith("rank 1 on node1 gone: rank 0 cannot serve alone"), status
            shown = ok(cli_at(state, "status", name))
            assert "degraded: rank 1 on node1 gone: rank 0 cannot serve alone" in " ".join(shown.split())
        finally:
            down = cli_at(state, "down", name, timeout=300)
        assert down.returncode == 0, down.stderr
        assert _ours(name) == [] and leftover_processes(name) == [], "llama.cpp processes left after down"


def test_rpc_worker_killed_during_boot_rolls_back_every_rank(tmp_path: Path) -> None:
    _needs_native()
    name = f"test-e2e-llamarpc-kill-{RUN}"
    port, rdv = free_ports(2)
    err_path = tmp_path / "up.err"
    with loopback_fleet(2, tmp_path / "fleet", shared_hf_cache=caches.local_hf_cache()) as fleet:
        sets = [f"port={port}", f"rendezvous_port={rdv}"]
        with up_in_background(name, TWO, fleet.cluster_file, sets, tmp_path / "state", err_path) as up:
            deadline = time.monotonic() + 120
            worker = None
            while worker is None and time.monotonic() < deadline and up.poll() is None:
                worker = rank_top_process(name, 1)
                time.sleep(0.02)
            assert worker is not None, err_path.read_text()[-3000:]
            os.kill(worker, signal.SIGKILL)  # before rank 0 is ready: up must not say ready
            up.wait(timeout=600)
            left = _ours(name)
    stderr = err_path.read_text()
    assert up.returncode == 2, stderr
    assert "rank 1 on node1 exited" in stderr, stderr
    assert left == [], f"llama.cpp processes of {name} left after the rollback: {left}"


def test_rpc_worker_killed_after_ready_is_brought_back_by_watch_workers_first(tmp_path: Path) -> None:
    _needs_native()
    name = f"test-e2e-llamarpc-watch-{RUN}"
    state = tmp_path / "state"
    port, rdv = free_ports(2)
    with loopback_fleet(2, tmp_path / "fleet", shared_hf_cache=caches.local_hf_cache()) as fleet:
        sets = [f"port={port}", f"rendezvous_port={rdv}", "serve.restart=on-failure", "serve.backoff=0"]
        try:
            ok(cli_at(state, "up", str(TWO), "--name", name, "--cluster", str(fleet.cluster_file),
                     *(w for s in sets for w in ("--set", s))))  # fmt: skip
            watch_out = tmp_path / "watch.out"
            worker = rank_top_process(name, 1)
            assert worker is not None
            with watching(name, state, watch_out) as watch:
                os.kill(worker, signal.SIGKILL)
                text = wait_for_line(watch, watch_out, "restarted")
            assert "rank 1 on node1 exited: exit code -9" in text, text
            assert "ready again" in text, text
            status = json.loads(ok(cli_at(state, "status", name, "--json")))[0]
            assert status["status"] == "ready" and status["restarts"] == 1, status
            assert [r["state"] for r in status["ranks"]] == ["running", "running"], status
            new_worker = rank_top_process(name, 1)
            assert new_worker is not None and new_worker != worker
            # The whole deployment came back in llama.cpp's order: the rpc-server, then the server.
            with sqlite3.connect(state / "state.db") as db:
                starts = db.execute("SELECT message FROM events WHERE name = ? AND kind = 'start' ORDER BY id",
                                    (name,)).fetchall()  # fmt: skip
            last_two = [m for (m,) in starts][-2:]
            assert last_two[0].startswith("rank 1 started") and last_two[1].startswith("rank 0 started"), starts
            assert "Berlin" in _complete(status["endpoint"])  # it serves again, over the new worker
        finally:
            down = cli_at(state, "down", name, timeout=300)
        assert down.returncode == 0, down.stderr
        assert _ours(name) == [] and leftover_processes(name) == []


def _complete(endpoint: str) -> str:
    body = {"model": "gemma3-270m", "prompt": "The capital of France is Paris. The capital of Germany is",
            "max_tokens": 8, "temperature": 0}  # fmt: skip
    return str(httpx.post(f"{endpoint}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"])
