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


SET_TOKEN = "set-via-dash-dash-set-8f3a2c"  # shaped like no token: only its name marks it secret
ARG_KEY = "sk-ArgsApiKey0123456789abcdef"


def _everything_readable(pid_dirs: Path = Path("/proc")) -> str:
    """Every process's argv on this machine (what `ps` shows every user)."""
    words = []
    for cmdline in pid_dirs.glob("[0-9]*/cmdline"):
        try:
            words.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(words)


def test_secrets_in_set_and_in_args_reach_no_file_output_or_argv(tmp_path: Path) -> None:
    name, state = "argsecret", tmp_path / "state"
    env = {"SPARKFLEET_STATE_DIR": str(state)}
    folder = tmp_path / name
    folder.mkdir()
    port = _free_port()
    (folder / "recipe.toml").write_text("\n".join([
        'engine = "vllm"', 'model = "org/standin"', f"port = {port}", f"rendezvous_port = {port + 1}",
        f'entrypoint = ["{sys.executable}", "{STANDIN}"]', f'args = ["--api-key", "{ARG_KEY}"]',
        "[env]", 'STANDIN_LEAK = "X_TOKEN"',
    ]) + "\n")  # fmt: skip
    secrets = (SET_TOKEN, ARG_KEY)

    validate = sparkfleet("validate", str(folder), env=env)
    assert validate.returncode == 0, validate.stderr
    assert "warning" in validate.stderr and "--api-key" in validate.stderr and "VLLM_API_KEY" in validate.stderr
    plan = sparkfleet("plan", str(folder), "--json", "--set", f"env.X_TOKEN={SET_TOKEN}", env=env)
    assert plan.returncode == 0, plan.stderr
    assert "--api-key" in plan.stderr  # the warning
    assert not any(s in plan.stdout + plan.stderr for s in secrets)

    up = sparkfleet("up", str(folder), "--set", f"env.X_TOKEN={SET_TOKEN}", env=env)
    try:
        assert up.returncode == 0, up.stderr
        shown = up.stdout + up.stderr
        for command in (["status", name], ["logs", name], ["status", name, "--json"]):
            out = sparkfleet(*command, env=env)
            shown += out.stdout + out.stderr
        assert "using X_TOKEN=***" in shown  # the engine got the --set token (and its log hides it)
        assert not any(s in shown for s in secrets)
        assert not any(s in _everything_readable() for s in secrets)  # in no process's argv
        assert not any(s.encode() in _stored_bytes(state) for s in secrets)  # state.db, its WAL, logs
        logs = list(state.rglob(f"deployments/{name}/r*.log"))
        envs = list(state.rglob(f"deployments/{name}/r*.env"))
        assert logs and envs
        assert all(p.stat().st_mode & 0o077 == 0 for p in logs + envs)
        assert all(s.encode() in envs[0].read_bytes() for s in secrets)  # passed to the engine by env
    finally:
        down = sparkfleet("down", name, env=env)
    assert down.returncode == 0, down.stderr
    assert list(state.rglob(f"deployments/{name}/r*.env")) == []  # down takes the secrets away
    assert not any(s.encode() in p.read_bytes() for p in state.rglob("*") if p.is_file() for s in secrets)
    assert leftover_processes(name) == []
