"""Two controllers (two state dirs), one fleet, one deployment name: the second `up` is refused
naming the first, its rollback and its `down` leave the first serving, and a taken port is
refused before anything starts — on the local node, over SSH, and with docker."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
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


def _killed_during_up(recipe: Path, cluster: list[str], state: dict[str, str], name: str, ranks: int) -> None:
    """An up whose controller is SIGKILLed once every rank runs (rank 0 not yet healthy): no
    rollback, the record left starting, the ranks running on."""
    argv = [sys.executable, "-m", "sparkfleet.cli.main", "up", str(recipe), *cluster]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **state})
    deadline = time.monotonic() + 90
    while len(leftover_processes(name)) < ranks and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    assert len(leftover_processes(name)) >= ranks, "the ranks never started"


def test_an_orphan_of_a_killed_up_is_kept_refused_and_stopped_by_down(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    name, state = "orphan", _state(tmp_path, "alice")
    cluster = ["--cluster", str(fleet2.cluster_file)]
    recipe = standin_recipe(tmp_path / name, nodes=2, port=_free_port(),
                            env={"STANDIN_FAULT_RANK": "0", "STANDIN_DELAY": "300"})  # fmt: skip
    try:
        _killed_during_up(recipe, cluster, state, name, 2)
        orphan = json.loads(sparkfleet("status", name, "--json", env=state).stdout)[0]
        running = sorted(leftover_processes(name))

        again = sparkfleet("up", str(recipe), *cluster, env=state)
        assert again.returncode == 2
        assert "controller that is gone" in again.stderr and f"sparkfleet down {name}" in again.stderr
        assert sorted(leftover_processes(name)) == running  # the refusal touched nothing on the nodes
        kept = json.loads(sparkfleet("status", name, "--json", env=state).stdout)[0]
        assert (kept["status"], kept.get("instance")) == (orphan["status"], orphan.get("instance"))  # nor its record

        down = sparkfleet("down", name, env=state)
        assert down.returncode == 0, down.stderr
        assert "stopped" in down.stdout and "nothing was running" not in down.stdout
        assert leftover_processes(name) == []
        # Now the name is free again.
        assert json.loads(sparkfleet("status", name, "--json", env=state).stdout)[0]["status"] == "stopped"
    finally:
        sparkfleet("down", name, "--sweep", *cluster, env=state)
    assert leftover_processes(name) == []


def test_status_says_when_the_controller_of_a_starting_instance_is_gone(tmp_path: Path) -> None:
    name, state = "abandoned", _state(tmp_path, "alice")
    recipe = standin_recipe(tmp_path / name, nodes=1, port=_free_port(),
                            env={"STANDIN_FAULT_RANK": "0", "STANDIN_DELAY": "300"})  # fmt: skip
    try:
        _killed_during_up(recipe, [], state, name, 1)
        shown = sparkfleet("status", name, env=state)
        assert shown.returncode == 0 and "starting" in shown.stdout
        assert "controller is gone" in shown.stdout, shown.stdout
        assert json.loads(sparkfleet("status", name, "--json", env=state).stdout)[0].get("controller_gone") is True
    finally:
        sparkfleet("down", name, env=state)
        sparkfleet("down", name, "--sweep", env=state)
    assert leftover_processes(name) == []


def test_down_stops_an_earlier_instance_whose_record_was_replaced(tmp_path: Path) -> None:
    """The orphan's record gone (an older sparkfleet replaced it): down NAME still finds the
    ranks this controller started, by their markers, and names them with their start time."""
    name, state = "replaced", _state(tmp_path, "alice")
    recipe = standin_recipe(tmp_path / name, nodes=1, port=_free_port(),
                            env={"STANDIN_FAULT_RANK": "0", "STANDIN_DELAY": "300"})  # fmt: skip
    try:
        _killed_during_up(recipe, [], state, name, 1)
        db = sqlite3.connect(tmp_path / "state-alice" / "state.db")
        with db:  # what today's older sparkfleet left: the record of a later, refused instance
            db.execute("UPDATE deployments SET status = 'failed', instance = 'feedfacecafe' WHERE name = ?", (name,))
        db.close()
        down = sparkfleet("down", name, env=state)
        assert down.returncode == 0, down.stderr
        assert "this controller started at" in down.stdout and " UTC" in down.stdout, down.stdout
        assert leftover_processes(name) == []
    finally:
        sparkfleet("down", name, "--sweep", env=state)
    assert leftover_processes(name) == []


def test_sweep_works_on_the_local_cluster_without_a_file(tmp_path: Path) -> None:
    name = "localsweep"
    recipe = standin_recipe(tmp_path / name, nodes=1, port=_free_port())
    alice, bob = _state(tmp_path, "alice"), _state(tmp_path, "bob")
    assert sparkfleet("up", str(recipe), env=alice).returncode == 0
    try:
        out = sparkfleet("down", name, "--sweep", env=bob)  # bob has no record and no cluster file
        assert out.returncode == 0, out.stderr
        assert f"found 1 rank(s) of {name!r}" in out.stdout
        assert leftover_processes(name) == []
    finally:
        sparkfleet("down", name, env=alice)
    assert leftover_processes(name) == []
