"""The docker runtime against the real dockerd: labelled containers, env through a private env
file (secrets never in argv), readiness, rollback and down leaving no container behind."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from tests.fleet.loopback import LoopbackFleet
from tests.integration.conftest import leftover_containers, needs_docker, sparkfleet

pytestmark = [pytest.mark.integration, needs_docker]
IMAGE = "sparkfleet-test:latest"
SECRET = "hf_thisIsASecretToken123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def docker_recipe(folder: Path, *, nodes: int, env: dict[str, str] | None = None) -> Path:
    """vLLM-shaped ranks (rank 0 serves, others headless) run by the image's stand-in."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env_lines = "\n".join(f'{k} = "{v}"' for k, v in (env or {}).items())
    (folder / "recipe.toml").write_text(
        f'engine = "vllm"\nmodel = "org/standin"\ndocker_image = "{IMAGE}"\nport = {port}\n'
        f"rendezvous_port = {port + 1}\nrequired_nodes = {nodes}\ntensor_parallel_size = {nodes}\n"
        'entrypoint = ["standin-rank"]\nshm_size = "1g"\n'
        # Headless ranks get no --port: give each its own so ranks sharing one host never clash.
        f'[env]\nSTANDIN_PORT = "{2000 + port % 4000}{{{{rank}}}}"\n{env_lines}\n'
        '[verify]\nexpect = ["fired up and ready"]\n'
    )
    return folder


def test_up_status_down_with_docker_on_the_local_cluster(tmp_path: Path) -> None:
    recipe = docker_recipe(tmp_path / "dock", nodes=1)
    up = sparkfleet("up", str(recipe), "--env", "HF_TOKEN", env={"HF_TOKEN": SECRET})
    try:
        assert up.returncode == 0, up.stderr
        inspect = json.loads(subprocess.run(["docker", "inspect", "sparkfleet-dock-r0"], capture_output=True,
                                            text=True, check=True).stdout)[0]  # fmt: skip
        labels = inspect["Config"]["Labels"]
        assert labels["sparkfleet.deployment"] == "dock" and labels["sparkfleet.rank"] == "0"
        assert inspect["HostConfig"]["NetworkMode"] == "host"
        assert inspect["HostConfig"]["IpcMode"] == "host"
        assert SECRET not in json.dumps(inspect["Args"]) + inspect["Path"]
        assert f"HF_TOKEN={SECRET}" in inspect["Config"]["Env"]  # reached the engine, via the env file
        assert "HF_HUB_OFFLINE=1" in inspect["Config"]["Env"]
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert SECRET not in ps
        status = json.loads(sparkfleet("status", "dock", "--json").stdout)[0]
        assert status["ranks"][0]["state"] == "running" and status["ranks"][0]["health"] == "healthy"
        assert SECRET not in sparkfleet("logs", "dock").stdout
    finally:
        down = sparkfleet("down", "dock")
    assert down.returncode == 0, down.stderr
    assert leftover_containers("dock") == []


def test_crashing_container_rolls_back_every_rank(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    recipe = docker_recipe(tmp_path / "dcrash", nodes=2, env={"STANDIN_EXIT": "7", "STANDIN_DELAY": "1"})
    out = sparkfleet("up", str(recipe), "--cluster", str(fleet2.cluster_file))
    assert out.returncode == 2
    assert "exited with code 7" in out.stderr and "simulated failure" in out.stderr
    assert leftover_containers("dcrash") == []


def test_two_nodes_over_ssh_and_down_after_state_loss(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    recipe = docker_recipe(tmp_path / "dtwo", nodes=2)
    up = sparkfleet("up", str(recipe), "--cluster", str(fleet2.cluster_file))
    assert up.returncode == 0, up.stderr
    assert sorted(leftover_containers("dtwo")) != []
    names = subprocess.run(["docker", "ps", "--format", "{{.Names}}", "--filter", "label=sparkfleet.deployment=dtwo"],
                           capture_output=True, text=True).stdout.split()  # fmt: skip
    assert sorted(names) == ["sparkfleet-dtwo-r0", "sparkfleet-dtwo-r1"]
    fresh = {"SPARKFLEET_STATE_DIR": str(tmp_path / "other")}
    assert sparkfleet("down", "dtwo", env=fresh).returncode == 2  # no record here: nothing stopped by name
    assert len(leftover_containers("dtwo")) == 2
    down = sparkfleet("down", "dtwo", "--sweep", "--cluster", str(fleet2.cluster_file), env=fresh)
    assert down.returncode == 0, down.stderr
    # Each node lists its own container (the shared dockerd's other node's is not counted twice).
    assert "node0: container sparkfleet-dtwo-r0 (rank 0, running; instance" in down.stdout
    assert "node1: container sparkfleet-dtwo-r1 (rank 1, running; instance" in down.stdout
    assert "found 2 rank(s)" in down.stdout
    assert leftover_containers("dtwo") == []
