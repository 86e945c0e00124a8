"""Two controllers (two state dirs), one fleet, one deployment name: the second `up` is refused
naming the first, its rollback and its `down` leave the first serving, and a taken port is
refused before anything starts — on the local node, over SSH, and with docker."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.fleet.loopback import LoopbackFleet
from tests.integration.conftest import (
    leftover_containers,
    leftover_processes,
    needs_docker,
    sparkfleet,
    standin_recipe,
)

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serves(endpoint: str) -> bool:
    try:
        return httpx.get(f"{endpoint}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _state(tmp: Path, who: str) -> dict[str, str]:
    return {"SPARKFLEET_STATE_DIR": str(tmp / f"state-{who}")}


def _endpoint(state: dict[str, str], name: str) -> str:
    return str(json.loads(sparkfleet("status", name, "--json", env=state).stdout)[0]["endpoint"])


def _second_controller_cannot_touch_the_first(tmp: Path, recipe: Path, cluster: list[str], name: str) -> None:
    alice, bob = _state(tmp, "alice"), _state(tmp, "bob")
    first = sparkfleet("up", str(recipe), *cluster, env=alice)
    assert first.returncode == 0, first.stderr
    endpoint = _endpoint(alice, name)
    try:
        before = len(leftover_processes(name)) + len(leftover_containers(name))
        second = sparkfleet("up", str(recipe), *cluster, env=bob)
        assert second.returncode == 2
        assert "already on its nodes under another instance" in second.stderr
        assert "state-alice" in second.stderr  # the owner: alice's controller and state dir
        assert "ready" not in second.stdout
        assert _serves(endpoint)  # bob's rollback stopped nothing of alice's
        down = sparkfleet("down", name, env=bob)
        assert down.returncode == 0, down.stderr
        assert "nothing was running" in down.stdout
        assert _serves(endpoint)
        assert len(leftover_processes(name)) + len(leftover_containers(name)) == before
        status = json.loads(sparkfleet("status", name, "--json", env=alice).stdout)[0]
        assert status["status"] == "ready" and all(r["state"] == "running" for r in status["ranks"])
    finally:
        assert sparkfleet("down", name, env=alice).returncode == 0
    assert leftover_processes(name) == [] and leftover_containers(name) == []


def test_two_state_dirs_one_local_node_one_name(tmp_path: Path) -> None:
    recipe = standin_recipe(tmp_path / "shared", nodes=1, port=_free_port())
    _second_controller_cannot_touch_the_first(tmp_path, recipe, [], "shared")


def test_two_controllers_one_ssh_fleet_one_name(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    """Both controllers reach the nodes as the same user: the same workdir and pid files on
    every node, which the refused up must leave alone."""
    recipe = standin_recipe(tmp_path / "lab", nodes=2, port=_free_port())
    _second_controller_cannot_touch_the_first(tmp_path, recipe, ["--cluster", str(fleet2.cluster_file)], "lab")


@needs_docker
def test_two_controllers_one_docker_node_one_name(tmp_path: Path) -> None:
    from tests.integration.test_lifecycle_docker import docker_recipe

    recipe = docker_recipe(tmp_path / "dshared", nodes=1)
    _second_controller_cannot_touch_the_first(tmp_path, recipe, [], "dshared")


@contextmanager
def _listener(port: int) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_taken_port_is_refused_before_start_naming_port_and_holder(tmp_path: Path) -> None:
    port = _free_port()
    alice, bob = _state(tmp_path, "alice"), _state(tmp_path, "bob")
    # A port held by a program that is not sparkfleet's: named by pid and command.
    with _listener(port) as server:
        out = sparkfleet("up", str(standin_recipe(tmp_path / "web", nodes=1, port=port)), env=alice)
        assert out.returncode == 2
        assert f"local: port {port} (rank 0 HTTP) is held by pid {server.pid}" in out.stderr
        assert "http.server" in out.stderr and "nothing was started" in out.stderr
        assert leftover_processes("web") == []
    # A port held by another controller's deployment: named by deployment and owner.
    first = sparkfleet("up", str(standin_recipe(tmp_path / "one", nodes=1, port=port)), env=alice)
    assert first.returncode == 0, first.stderr
    try:
        other = sparkfleet("up", str(standin_recipe(tmp_path / "two", nodes=1, port=port)), env=bob)
        assert other.returncode == 2
        assert f"port {port} (rank 0 HTTP) is held by sparkfleet deployment 'one'" in other.stderr
        assert "state-alice" in other.stderr
        assert leftover_processes("two") == []
        assert _serves(_endpoint(alice, "one"))
    finally:
        sparkfleet("down", "one", env=alice)
