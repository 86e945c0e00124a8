"""An engine that prints its own API key: the value appears in no output, log view (`logs`,
`logs -f`, the dashboard), error tail, event or stored record — with both runtimes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkfleet.dashboard import data as dashboard_data
from sparkfleet.state.store import Store
from tests.integration.conftest import STANDIN, docker_ok, leftover_containers, leftover_processes, sparkfleet

pytestmark = pytest.mark.integration
# Matches none of the token patterns: only the deployment's own secret values can hide it.
SECRET = "correct-horse-battery-staple-4711"
SECRET_ENV = {"MY_API_KEY": SECRET}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _recipe(folder: Path, runtime: str, verify: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    lines = ['engine = "vllm"', 'model = "org/standin"', f"port = {port}", f"rendezvous_port = {port + 1}"]
    if runtime == "docker":
        lines += ['docker_image = "sparkfleet-test:latest"', 'entrypoint = ["standin-rank"]']
    else:
        lines.append(f'entrypoint = ["{sys.executable}", "{STANDIN}"]')
    lines += ["[env]", 'STANDIN_LEAK = "MY_API_KEY"', f'STANDIN_PORT = "{port}"', "[verify]", verify]
    (folder / "recipe.toml").write_text("\n".join(lines) + "\n")
    return folder


def _stored_bytes(state: Path) -> bytes:
    return b"".join(p.read_bytes() for p in state.rglob("*") if p.is_file() and not p.name.endswith(".env"))


RUNTIMES = ["process", pytest.param("docker", marks=pytest.mark.skipif(not docker_ok(), reason="no dockerd"))]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_leaked_key_is_hidden_in_logs_status_dashboard_and_state(runtime: str, tmp_path: Path) -> None:
    name = f"leak-{runtime}"
    recipe = _recipe(tmp_path / name, runtime, 'expect = ["fired up"]')
    up = sparkfleet("up", str(recipe), "--env", "MY_API_KEY", env=SECRET_ENV)
    try:
        assert up.returncode == 0, up.stderr
        assert SECRET not in up.stdout + up.stderr
        logs = sparkfleet("logs", name)
        assert logs.returncode == 0, logs.stderr
        assert "using MY_API_KEY=*** for downloads" in logs.stdout  # the line is there, the value is not
        assert "Authorization: Bearer ***" in logs.stdout
        assert SECRET not in logs.stdout + logs.stderr
        follow = subprocess.Popen([sys.executable, "-m", "sparkfleet.cli.main", "logs", name, "-f"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        time.sleep(4)
        follow.terminate()
        followed, _ = follow.communicate(timeout=30)
        assert "using MY_API_KEY=***" in followed and SECRET not in followed
        status = sparkfleet("status", name, "--json")
        assert SECRET not in status.stdout
        shown = dashboard_data.deployments(Store())
        assert shown[0]["ranks"][0]["log"]  # the dashboard shows the log's tail...
        assert SECRET not in json.dumps(shown)  # ...without the key
    finally:
        down = sparkfleet("down", name)
    assert down.returncode == 0 and SECRET not in down.stdout + down.stderr
    assert SECRET.encode() not in _stored_bytes(Path(os.environ["SPARKFLEET_STATE_DIR"]))
    assert leftover_processes(name) == [] and leftover_containers(name) == []


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_failed_up_shows_the_log_tail_without_the_key(runtime: str, tmp_path: Path) -> None:
    name = f"leakfail-{runtime}"
    recipe = _recipe(tmp_path / name, runtime, 'forbid = ["Bearer"]')
    up = sparkfleet("up", str(recipe), "--env", "MY_API_KEY", env=SECRET_ENV)
    assert up.returncode == 2
    assert "forbidden boot-log line 'Bearer' appeared" in up.stderr
    assert "Authorization: Bearer ***" in up.stderr and SECRET not in up.stdout + up.stderr
    events = sparkfleet("status", name, "--json")
    assert SECRET not in events.stdout
    assert SECRET.encode() not in _stored_bytes(Path(os.environ["SPARKFLEET_STATE_DIR"]))
    assert leftover_processes(name) == [] and leftover_containers(name) == []
