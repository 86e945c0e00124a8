"""The network checks and `init` on a fleet with real networks: every node in its own network
namespace (tests/fleet/netns.py), node1's fabric NIC named enp1s0f1np1, the others enp1s0f0np0.

Faults are real: a recipe's NCCL_SOCKET_IFNAME that node1 does not have, an HCA gone from node2,
a route node0 lacks to node3 (the pair cannot talk either way), node3's fabric MTU at 1500.
doctor must fail each with its node and key, and pass the clean fleet; `init` must write a
cluster file that plans and passes doctor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet.netns import NetnsFleet, names_in_use, usable

STANDIN = Path(__file__).resolve().parents[1] / "standin_engine.py"
WHY_NOT = usable()

pytestmark = [pytest.mark.integration, pytest.mark.skipif(WHY_NOT is not None, reason=f"netns fleet: {WHY_NOT}")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsFleet]:
    f = NetnsFleet(4, tmp_path_factory.mktemp("netns"), odd=1)
    try:
        yield f
    finally:
        f.close()
    assert names_in_use(f.tag) == []


def _recipe(folder: Path, env: dict[str, str] | None = None) -> Path:
    """A 4-node SGLang stand-in whose ranks use NCCL over IB (model: a path, so no snapshot check)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ['engine = "sglang"', f'model = "{folder}/model"', "port = 31000", "rendezvous_port = 31001",
             "required_nodes = 4", "tensor_parallel_size = 4", f'entrypoint = ["{sys.executable}", "{STANDIN}"]',
             "[env]", 'NCCL_NET = "IB"', *(f'{k} = "{v}"' for k, v in (env or {}).items())]  # fmt: skip
    (folder / "recipe.toml").write_text("\n".join(lines) + "\n")
    return folder


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NO_COLOR": "1"})  # fmt: skip


def _doctor(recipe: Path, cluster: Path) -> tuple[int, dict[tuple[str, str], str], set[tuple[str, str]]]:
    proc = _cli("doctor", str(recipe), "--cluster", str(cluster), "--json", "--timeout", "20")
    assert proc.stdout.strip(), proc.stderr
    checks = json.loads(proc.stdout)["checks"]
    fails = {(c["id"], c["node"]): c["evidence"] for c in checks if c["status"] == "fail"}
    return proc.returncode, fails, {(c["id"], c["node"]) for c in checks}


def test_clean_fleet_passes_every_network_check(fleet: NetnsFleet, tmp_path: Path) -> None:
    rc, fails, ids = _doctor(_recipe(tmp_path / "r"), fleet.cluster_file)
    assert rc == 0 and fails == {}
    for node in ("node0", "node1", "node2", "node3"):
        assert {("net.socket_ifname", node), ("rdma.hca", node), ("rdma.gid_index", node),
                ("net.advertise", node), ("fabric.reachable", node)} <= ids  # fmt: skip
    assert ("fabric.mtu", "fleet") in ids


def test_a_recipe_interface_name_that_one_node_lacks_fails_there(fleet: NetnsFleet, tmp_path: Path) -> None:
    # The seed's hazard: one NCCL_SOCKET_IFNAME for all nodes; node1's NIC is enp1s0f1np1.
    recipe = _recipe(tmp_path / "r", {"NCCL_SOCKET_IFNAME": "enp1s0f0np0"})
    rc, fails, _ = _doctor(recipe, fleet.cluster_file)
    assert rc == 1 and set(fails) == {("net.socket_ifname", "node1")}, fails
    ev = fails[("net.socket_ifname", "node1")]
    assert ev.startswith("NCCL_SOCKET_IFNAME=enp1s0f0np0 (recipe): no interface enp1s0f0np0 on node1")
    assert "192.168.200.12 is on enp1s0f1np1" in ev
    assert "node node1: recipe [env] NCCL_SOCKET_IFNAME=enp1s0f0np0" in _cli(
        "plan", str(recipe), "--cluster", str(fleet.cluster_file)).stderr  # fmt: skip


def test_a_missing_hca_fails_on_its_node(fleet: NetnsFleet, tmp_path: Path) -> None:
    fleet.remove_hca(2, "roceP2p1s0f0")
    try:
        rc, fails, _ = _doctor(_recipe(tmp_path / "r"), fleet.cluster_file)
    finally:
        fleet.write_rdma(fleet.nodes[2])
    assert rc == 1 and set(fails) == {("rdma.hca", "node2")}, fails
    assert fails[("rdma.hca", "node2")].startswith(
        "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0 (cluster): roceP2p1s0f0 not on this node (has: "
    )


def test_an_unreachable_pair_fails_on_both_ends(fleet: NetnsFleet, tmp_path: Path) -> None:
    fleet.block(0, 3)  # node0 has no route to node3: its own tries fail, and it cannot answer node3's
    try:
        rc, fails, _ = _doctor(_recipe(tmp_path / "r"), fleet.cluster_file)
    finally:
        fleet.unblock(0, 3)
    assert rc == 1 and set(fails) == {("fabric.reachable", "node0"), ("fabric.reachable", "node3")}, fails
    assert fails[("fabric.reachable", "node0")] == "node0 → node3 192.168.200.14:31001: No route to host"
    assert fails[("fabric.reachable", "node3")] == "node3 → node0 192.168.200.11:31001: timed out"


def test_an_mtu_mismatch_names_the_odd_node(fleet: NetnsFleet, tmp_path: Path) -> None:
    fleet.set_mtu(3, 1500)
    try:
        rc, fails, _ = _doctor(_recipe(tmp_path / "r"), fleet.cluster_file)
    finally:
        fleet.set_mtu(3, 9000)
    assert rc == 1 and set(fails) == {("fabric.mtu", "node3")}, fails
    assert fails[("fabric.mtu", "node3")].startswith("fabric interface enp1s0f0np0 has MTU 1500, the others 9000")


def test_init_writes_a_cluster_that_plans_and_passes_doctor(fleet: NetnsFleet, tmp_path: Path) -> None:
    out = tmp_path / "found.toml"
    hosts = [n.name for n in fleet.nodes]
    proc = _cli("init", *hosts, "--ssh-config", str(fleet.ssh_config), "--ssh-key", str(fleet.client_key),
                "-o", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    found = tomllib.loads(out.read_text())
    by_name = {n["name"]: n for n in found["nodes"]}
    assert [n["host"] for n in found["nodes"]] == hosts  # rank order as given
    assert by_name["node1"]["fabric_ifname"] == "enp1s0f1np1" and by_name["node0"]["fabric_ifname"] == "enp1s0f0np0"
    assert by_name["node1"]["ib_hca"] == "rocep1s0f1,roceP2p1s0f1" and by_name["node1"]["ib_gid_index"] == 3
    assert [n["fabric_ip"] for n in found["nodes"]] == [n.fabric_ip for n in fleet.nodes]
    assert "# not the fabric: enP7s7 10.0.0.12/24" in out.read_text()
    recipe = _recipe(tmp_path / "r")
    planned = _cli("plan", str(recipe), "--cluster", str(out), "--strict")
    assert planned.returncode == 0 and "warning" not in planned.stderr, planned.stderr
    rc, fails, _ = _doctor(recipe, out)
    assert rc == 0 and fails == {}
    refused = _cli("init", *hosts, "--ssh-config", str(fleet.ssh_config), "-o", str(out))
    assert refused.returncode == 2 and "exists; pass --force" in refused.stderr


def test_init_without_roce_stops_with_the_candidates_and_the_option(fleet: NetnsFleet, tmp_path: Path) -> None:
    # No RDMA anywhere: management and fabric networks are both on every node, nothing tells them apart.
    for node in fleet.nodes:
        node.sys_root.rename(node.sys_root.with_name("sys.off"))
    try:
        base = ["init", *(n.name for n in fleet.nodes), "--ssh-config", str(fleet.ssh_config)]
        proc = _cli(*base, "-o", str(tmp_path / "a.toml"))
        picked = _cli(*base, "-o", str(tmp_path / "b.toml"), "--fabric-subnet", "192.168.200.0/24")
    finally:
        for node in fleet.nodes:
            node.sys_root.with_name("sys.off").rename(node.sys_root)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "10.0.0.0/24 (node0 enP7s7 10.0.0.11" in proc.stderr and "192.168.200.0/24 (node0 enp1s0f0np0" in proc.stderr
    assert "--fabric-subnet CIDR" in proc.stderr and not (tmp_path / "a.toml").exists()
    assert picked.returncode == 0, picked.stderr
    nodes = tomllib.loads((tmp_path / "b.toml").read_text())["nodes"]
    assert [n["fabric_ifname"] for n in nodes] == ["enp1s0f0np0", "enp1s0f1np1", "enp1s0f0np0", "enp1s0f0np0"]
    assert all("ib_hca" not in n for n in nodes)
