"""doctor end to end: the real CLI over real sshd nodes (loopback fleet), with real faults.

Faults: node1's Docker daemon (a second, private dockerd) lacks the image; node2's staging
disk is a full 1 MiB tmpfs; rank 0's HTTP port is held by a listening socket; node3's sshd is
stopped. doctor must name each with its node and pass the healthy rest.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import loopback_fleet
from tests.fleet.loopback import LoopbackFleet
from tests.integration.second_dockerd import available, second_dockerd

IMAGE = "sparkfleet-test:latest"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="openssh-server missing"),
    pytest.mark.skipif(not available(), reason="needs root and a running dockerd"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def _recipe(path: Path, port: int, rdv: int) -> Path:
    path.mkdir(parents=True)
    (path / "recipe.toml").write_text(
        f'engine = "vllm"\ndocker_image = "{IMAGE}"\nmodel = "org/tiny"\nport = {port}\n'
        f"rendezvous_port = {rdv}\nrequired_nodes = 4\ntensor_parallel_size = 4\n\n"
        '[[staging]]\nkind = "copy"\nid = "engram"\nsrc = "{{hf}}/x"\ndst = "{{state}}/engram"\n'
        'min_free = "64M"\n'
    )
    return path


def _snapshot(hf: Path) -> None:
    snap = hf / "hub" / "models--org--tiny" / "snapshots" / "rev1"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}')
    (snap / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")


def _doctor(recipe: Path, fleet: LoopbackFleet) -> tuple[int, dict[str, object], float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sparkfleet.cli.main", "doctor", str(recipe), "--cluster",
         str(fleet.cluster_file), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    wall = time.monotonic() - start
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout), wall


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[LoopbackFleet]:
    with loopback_fleet(4, tmp_path / "fleet") as f:
        for node in f.nodes:
            _snapshot(node.hf_cache)
        yield f


def test_healthy_fleet_passes(fleet: LoopbackFleet, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path / "r", _free_port(), _free_port())
    rc, report, _ = _doctor(recipe, fleet)
    fails = [c for c in report["checks"] if c["status"] == "fail"]  # type: ignore[union-attr,index]
    assert rc == 0 and fails == []
    ids = {(c["id"], c["node"]) for c in report["checks"]}  # type: ignore[union-attr,index]
    for node in ("node0", "node1", "node2", "node3"):
        assert {("ssh.reachable", node), ("docker.version", node), ("disk.staging_free", node),
                ("clock.skew", node), ("fabric.reachable", node)} <= ids  # fmt: skip
    assert {("image.same_id", "fleet"), ("model.snapshot_same", "fleet"), ("fabric.mtu", "fleet"),
            ("ports.free", "node0")} <= ids  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount tmpfs")
def test_every_planted_fault_is_named_with_its_node(fleet: LoopbackFleet, tmp_path: Path) -> None:
    port = _free_port()
    recipe = _recipe(tmp_path / "r", port, _free_port())
    full = fleet.nodes[2].state_dir / "engram"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)], check=True)
    holder = socket.socket()
    try:
        subprocess.run(["dd", "if=/dev/zero", f"of={full}/fill", "bs=64k", "count=64"], capture_output=True)
        holder.bind(("0.0.0.0", port))
        holder.listen()
        with second_dockerd() as docker_host:
            fleet.stop_node(1)
            cfg = fleet.nodes[1].sshd_config
            setenv = "SetEnv SPARKFLEET_NODE=node1"
            cfg.write_text(cfg.read_text().replace(setenv, f"{setenv} DOCKER_HOST={docker_host}"))
            fleet.start_node(1)
            fleet.stop_node(3)
            rc, report, wall = _doctor(recipe, fleet)
    finally:
        holder.close()
        subprocess.run(["umount", str(full)], check=False)
    fails = {(c["id"], c["node"]): c["evidence"] for c in report["checks"] if c["status"] == "fail"}  # type: ignore[union-attr,index]
    assert rc == 1
    assert set(fails) == {("image.same_id", "fleet"), ("disk.staging_free", "node2"),
                          ("ports.free", "node0"), ("ssh.reachable", "node3")}, fails  # fmt: skip
    assert "missing on node1" in fails[("image.same_id", "fleet")]
    assert "node2/state/engram" in fails[("disk.staging_free", "node2")]
    assert str(port) in fails[("ports.free", "node0")]
    assert "127.0." in fails[("ssh.reachable", "node3")]
    # Speed is measured by benchmarks/doctor_speed.py (bar: <= 3 s), not asserted here.
    print(f"doctor, 4 loopback nodes, 4 faults: {report['seconds']:.2f} s in doctor, {wall:.2f} s CLI wall")


@pytest.mark.slow
def test_a_frozen_node_costs_the_timeout_not_a_hang(fleet: LoopbackFleet, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path / "r", _free_port(), _free_port())
    fleet.freeze_node(2)  # sshd stopped with SIGSTOP: the TCP handshake completes, nothing answers
    try:
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "sparkfleet.cli.main", "doctor", str(recipe), "--cluster",
             str(fleet.cluster_file), "--json", "--timeout", "8"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        wall = time.monotonic() - start
    finally:
        fleet.thaw_node(2)
    report = json.loads(proc.stdout)
    fails = {(c["id"], c["node"]): c["evidence"] for c in report["checks"] if c["status"] == "fail"}
    assert set(fails) == {("ssh.reachable", "node2")}, fails
    assert "no answer within 8 s from root@127.0." in fails[("ssh.reachable", "node2")]
    assert wall < 40  # the timeout, plus start-up on a loaded machine
