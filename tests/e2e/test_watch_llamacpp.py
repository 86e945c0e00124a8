"""The restart policy with a real engine: examples/gemma-llamacpp on this machine (own name and
ports) with ``[serve] restart = "on-failure"``; its server SIGKILLed after ready comes back,
verified and smoke-tested again ('Berlin'), by `sparkfleet watch`; `down` then leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import CACHE, HUB, ROOT, RUN, _require, free_ports, wait_for_line, watching
from tests.e2e.test_engine_failures import rank_top_process
from tests.integration.conftest import leftover_processes

pytestmark = [pytest.mark.e2e]

NAME = f"test-e2e-watch-llama-{RUN}"


def test_llamacpp_killed_after_ready_is_brought_back_by_watch(tmp_path: Path) -> None:
    _require(CACHE / "venv-llama" / "bin" / "python", "the llama.cpp venv")
    _require(HUB / "models--sparkfleet--gemma3-270m-gguf", "the Gemma GGUF")
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "300"}

    def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True,
                              timeout=timeout, env=env)  # fmt: skip

    port, rpc = free_ports(2)
    sets = [f"port={port}", f"rendezvous_port={rpc}", "serve.restart=on-failure", "serve.backoff=0"]
    example = ROOT / "examples" / "gemma-llamacpp-python"
    up = cli("up", str(example), "--name", NAME, *(w for s in sets for w in ("--set", s)))
    assert up.returncode == 0, up.stderr[-3000:]
    watch_out = tmp_path / "watch.out"
    try:
        server = rank_top_process(NAME, 0)
        assert server is not None
        with watching(NAME, tmp_path / "state", watch_out) as watch:
            os.kill(server, signal.SIGKILL)
            text = wait_for_line(watch, watch_out, "restarted")
        assert "rank-exited rank 0 on local exited: exit code -9" in text, text
        assert "restart 1/3 of" in text and "restarted restart 1/3:" in text and "ready again" in text
        status = json.loads(cli("status", NAME, "--json").stdout)[0]
        assert status["status"] == "ready" and status["restarts"] == 1
        assert status["ranks"][0]["state"] == "running" and status["ranks"][0]["health"] == "healthy"
        new_server = rank_top_process(NAME, 0)
        assert new_server is not None and new_server != server
    finally:
        down = cli("down", NAME, timeout=300)
    assert down.returncode == 0, down.stderr
    assert "nothing of the instance is left" in down.stdout
    assert leftover_processes(NAME) == []
