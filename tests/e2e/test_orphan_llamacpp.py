"""A real engine orphaned by a killed controller: `sparkfleet up` of the llama.cpp example is
SIGKILLed once its engine runs. A second `up` of the name is refused and keeps the orphan's
record; `down NAME` stops the orphaned llama.cpp server. Own name, ports and state dir: it runs
beside (and never touches) the session deployments and a user's `gemma-llamacpp`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import CACHE, HUB, ROOT, RUN, _require, free_ports
from tests.integration.conftest import leftover_processes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAME = f"test-e2e-orphan-{RUN}"


def test_a_killed_ups_llamacpp_server_is_refused_kept_and_stopped_by_down(tmp_path: Path) -> None:
    _require(CACHE / "venv-llama" / "bin" / "python", "the llama.cpp venv")
    _require(HUB / "models--sparkfleet--gemma3-270m-gguf", "the Gemma GGUF")
    port, rpc = free_ports(2)
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(tmp_path / "state")}
    argv = [sys.executable, "-m", "sparkfleet.cli.main", "up", str(ROOT / "examples" / "gemma-llamacpp"),
            "--name", NAME, "--set", f"port={port}", "--set", f"rendezvous_port={rpc}"]  # fmt: skip

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True,
                              timeout=600, env=env)  # fmt: skip

    try:
        up = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 300
        while not leftover_processes(NAME) and time.monotonic() < deadline:
            time.sleep(0.2)
        up.kill()  # the controller dies: no rollback
        up.wait()
        orphan = sorted(leftover_processes(NAME))
        assert orphan, "the llama.cpp server never started"

        again = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
        assert again.returncode == 2, again.stdout + again.stderr
        assert "controller that is gone" in again.stderr
        assert sorted(leftover_processes(NAME)) == orphan
        record = json.loads(cli("status", NAME, "--json").stdout)[0]
        assert record["status"] == "starting" and record["controller_gone"] is True

        down = cli("down", NAME)
        assert down.returncode == 0, down.stderr
        assert leftover_processes(NAME) == []
    finally:
        cli("down", NAME)
        cli("down", NAME, "--sweep")
    assert leftover_processes(NAME) == []
