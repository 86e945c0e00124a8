"""`doctor --fabric` on a 4-node namespace fleet (tests/fleet/netns.py) whose fabric links are
shaped by `tc` to known rates: every link 200 Mbit/s (two shared cores carry two such pairs
each way at once), and faults made real: one link at 20 Mbit/s, 20 % of one node's packets
dropped (iptables' statistic match: this kernel has no netem), one switch port at MTU 1500 in a
9000-byte fabric. doctor must name exactly the pairs through the fault, with the measured rates
within 15 % of the shaped ones, finish the 4-node matrix in ≤ 15 s, and leave no iperf3 process
or listening port in any namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.netns import NetnsFleet, shaped_fleet, usable

STANDIN = Path(__file__).resolve().parents[1] / "standin_engine.py"
WHY_NOT = usable() or (None if shutil.which("iperf3") else "iperf3 missing (scripts/setup-system.sh installs it)")
pytestmark = [pytest.mark.integration, pytest.mark.skipif(WHY_NOT is not None, reason=f"netns fleet: {WHY_NOT}")]

FAST, SLOW = 200.0, 20.0
NODES = ("node0", "node1", "node2", "node3")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsFleet]:
    with shaped_fleet(4, tmp_path_factory.mktemp("fabric"), FAST, odd=1, name="fabric") as f:
        # The TCP tests run with the HCAs DOWN (no RDMA test): the RDMA test turns them ACTIVE.
        f.set_rdma(False)
        yield f


def _fabric(fleet: NetnsFleet, *extra: str) -> tuple[int, dict[str, Any], float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", "doctor", "--fabric", "--cluster",
                           str(fleet.cluster_file), "--json", *extra], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_COLOR": "1"})  # fmt: skip
    took = time.monotonic() - start
    assert proc.stdout.strip(), proc.stderr
    # Nothing stays behind on any node: no iperf3, no listener (the nodes' sshd runs on stdio).
    for i in range(4):
        assert "iperf3" not in fleet.processes(i), f"node{i} still runs iperf3"
        assert not [p for p in fleet.processes(i) if p.startswith("ib_write")], f"node{i} still runs perftest"
        assert not [p for p in fleet.processes(i) if p.startswith("python")], f"node{i} still runs the stream test"
        assert fleet.listening(i) == [], f"node{i} still listens: {fleet.listening(i)}"
    return proc.returncode, json.loads(proc.stdout), took


def _fails(report: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {(c["id"], c["node"]): c["evidence"] for c in report["checks"] if c["status"] == "fail"}


def _rates(report: dict[str, Any]) -> dict[tuple[str, str], float]:
    out = {}
    for p in report["pairs"]:
        out[(p["a"], p["b"])], out[(p["b"], p["a"])] = p["forward_mbps"], p["reverse_mbps"]
    return out


def _pair_names(report: dict[str, Any], node: str) -> set[str]:
    return {f"{p['a']}<->{p['b']}" for p in report["pairs"] if node in (p["a"], p["b"])}


def test_clean_fleet_passes_at_the_shaped_rate_within_15_s(fleet: NetnsFleet) -> None:
    rc, report, took = _fabric(fleet)
    assert rc == 0 and _fails(report) == {}, _fails(report)
    assert len(report["rounds"]) == 3 and len(report["pairs"]) == 6
    rates = _rates(report)
    assert len(rates) == 12
    for (src, dst), rate in rates.items():
        assert abs(rate - FAST) <= 0.15 * FAST, f"{src} → {dst}: {rate:.1f} Mbit/s, shaped to {FAST}"
    assert took <= 15.0 and report["seconds"] <= 15.0, (took, report["seconds"])
    assert {p["mtu_expected"] for p in report["pairs"]} == {9000} and {p["path_mtu"] for p in report["pairs"]} == {9000}
    # The link's own speed: veths report 10000 Mbit/s, tc shapes them to 200: the shaped rate is the expectation.
    assert {p["link_mbps"] for p in report["pairs"]} == {FAST}
    assert {c["status"] for c in report["checks"] if c["id"] == "fabric.link_speed"} == {"pass"}
    assert {p["rdma_hcas"] for p in report["pairs"]} == {None}  # HCAs DOWN: no RDMA test


def test_the_stream_test_measures_the_shaped_rates_where_iperf3_is_not_used(fleet: NetnsFleet) -> None:
    # `--fabric-tool stdlib` is what a fleet without iperf3 gets: sparkfleet's own stream test, Python
    # on each node, one stream each way. The slow link is named the same way, at its shaped rate.
    fleet.shape(3, SLOW)
    try:
        rc, report, _ = _fabric(fleet, "--fabric-tool", "stdlib")
    finally:
        fleet.shape(3, FAST)
    assert {p["tool"] for p in report["pairs"]} == {"stdlib"}
    assert rc == 1 and set(_fails(report)) == {("fabric.bandwidth", p) for p in _pair_names(report, "node3")}
    for (src, dst), rate in _rates(report).items():
        shaped = SLOW if "node3" in (src, dst) else FAST
        assert abs(rate - shaped) <= 0.15 * shaped, f"{src} → {dst}: {rate:.1f} Mbit/s, shaped to {shaped}"


def test_rdma_pairs_carry_the_captured_figures_and_a_slow_hca_is_named(fleet: NetnsFleet) -> None:
    # Each node's ib_write_bw / ib_write_lat is the stand-in (tests/fleet/perftest_standin.py): a
    # real server listening on its port and a real client connecting to it over the fabric, replaying
    # the captured DGX Spark output. node3's is told to report a tenth of the rate: its three pairs fail.
    fleet.set_rdma(True)
    try:
        rc0, clean, took = _fabric(fleet)
        fleet.perftest_scale(3, 0.1)
        rc, report, _ = _fabric(fleet)
        fleet.perftest_scale(3, None)
        # node2 without a route to node3: the perftest servers started on node3 never get their
        # client, and must be gone when doctor returns (_fabric checks every namespace).
        fleet.block(2, 3)
        try:
            _, blocked, _ = _fabric(fleet)
        finally:
            fleet.unblock(2, 3)
    finally:
        fleet.perftest_scale(3, None)
        fleet.set_rdma(False)
    gone = _fails(blocked)[("fabric.rdma", "node2<->node3")]
    assert "ib_write_bw not measured: ib_write_bw: Couldn't connect to 192.168.200.14:18515" in gone, gone
    assert rc0 == 0 and _fails(clean) == {}, _fails(clean)
    assert took <= 25.0, took  # the 15 s of the TCP matrix, plus perftest's servers and clients (Python here)
    hca = {f"node{i}": n.hcas[0] for i, n in enumerate(fleet.nodes)}
    for run, slow in ((clean, 111.71), (report, 11.17)):
        for p in run["pairs"]:
            assert p["rdma_hcas"] == [hca[p["a"]], hca[p["b"]]] and p["rdma_gids"] == [3, 3], p
            assert p["rdma_gbps"] == (slow if "node3" in (p["a"], p["b"]) else 111.71), p
            assert p["rdma_lat_us"] == 1.47 and p["rdma_expected_gbps"] == pytest.approx(126.03, abs=0.01), p
    fails = _fails(report)
    assert rc == 1 and set(fails) == {("fabric.rdma", p) for p in _pair_names(report, "node3")}, fails
    ev = fails[("fabric.rdma", "node0<->node3")]
    assert "node0 rocep1s0f0 (GID 3, enp1s0f0np0) → node3 rocep1s0f0 (GID 3, enp1s0f0np0)" in ev, ev
    assert "ib_write_bw 11.17 Gbit/s, expected ≥ 88.22 Gbit/s (0.7 × 126.0 Gbit/s, what the HCAs can carry" in ev, ev
    tools = {c["node"] for c in report["checks"] if c["id"] == "fabric.rdma_tool" and c["status"] == "pass"}
    assert tools == set(NODES)


def test_a_slow_link_names_exactly_the_pairs_through_it(fleet: NetnsFleet) -> None:
    fleet.shape(3, SLOW)
    try:
        rc, report, _ = _fabric(fleet)
    finally:
        fleet.shape(3, FAST)
    slow_pairs = _pair_names(report, "node3")
    assert rc == 1 and set(_fails(report)) == {("fabric.bandwidth", p) for p in slow_pairs}, _fails(report)
    for (src, dst), rate in _rates(report).items():
        shaped = SLOW if "node3" in (src, dst) else FAST
        assert abs(rate - shaped) <= 0.15 * shaped, f"{src} → {dst}: {rate:.1f} Mbit/s, shaped to {shaped}"
    ev = _fails(report)[("fabric.bandwidth", "node0<->node3")]
    assert "node0 enp1s0f0np0 → node3 enp1s0f0np0" in ev and "0.7 × the fleet's median" in ev
    node1 = next(ev for (_, pair), ev in _fails(report).items() if "node1" in pair)
    assert "node1 enp1s0f1np1" in node1  # each node's own NIC: node1's cable is in the other port


def test_loss_on_one_link_is_named_on_its_pairs(fleet: NetnsFleet) -> None:
    fleet.drop(2, 0.2)
    try:
        rc, report, _ = _fabric(fleet)
    finally:
        fleet.drop(2, None)
    fails = _fails(report)
    lossy = {node for (check, node) in fails if check == "fabric.loss"}
    assert rc == 1 and lossy == _pair_names(report, "node2"), fails
    assert all("pings lost, expected ≤ 1%" in ev for (check, _), ev in fails.items() if check == "fabric.loss")
    # Whatever else fails (TCP slows under loss) is on node2's pairs only.
    assert {node for _, node in fails} == _pair_names(report, "node2")


def test_a_hop_with_a_smaller_mtu_is_named_on_its_pairs(fleet: NetnsFleet) -> None:
    fleet.hop_mtu(1, 1500)
    try:
        rc, report, _ = _fabric(fleet)
    finally:
        fleet.hop_mtu(1, 9000)
    fails = _fails(report)
    small = {node for (check, node) in fails if check == "fabric.path_mtu"}
    assert rc == 1 and small == _pair_names(report, "node1"), fails
    ev = next(ev for (check, _), ev in fails.items() if check == "fabric.path_mtu")
    assert "9000-byte don't-fragment packets are lost, 1500 passes; the interface MTU is 9000" in ev
    assert "enp1s0f1np1" in ev  # node1's own NIC name


def test_a_pair_that_cannot_talk_is_named_and_its_server_stopped(fleet: NetnsFleet) -> None:
    # node2 has no route to node3: the iperf3 server started on node3 never gets its client, and
    # must be gone when doctor returns (_fabric checks every namespace). The pair is in the last
    # round, so the server's own time limit cannot have ended it before the check.
    fleet.block(2, 3)
    try:
        rc, report, _ = _fabric(fleet)
    finally:
        fleet.unblock(2, 3)
    assert report["rounds"][-1][-1] == ["node2", "node3"]
    fails = _fails(report)
    assert rc == 1 and {pair for _, pair in fails} == {"node2<->node3"}, fails
    assert {check for check, _ in fails} >= {"fabric.bandwidth", "fabric.loss"}
    assert "not measured: iperf3: unable to connect" in fails[("fabric.bandwidth", "node2<->node3")]


def test_up_refuses_a_recipe_whose_fabric_minimum_a_pair_misses(fleet: NetnsFleet, tmp_path: Path) -> None:
    # [verify] fabric_min_gbps = 0.1 (100 Mbit/s): node3's link at 20 fails its three pairs, up stops
    # before anything starts on any node.
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("\n".join([
        'engine = "sglang"', f'model = "{tmp_path}/model"', "port = 31000", "rendezvous_port = 31001",
        "required_nodes = 4", "tensor_parallel_size = 4", f'entrypoint = ["{sys.executable}", "{STANDIN}"]',
        "[verify]", "fabric_min_gbps = 0.1",
    ]) + "\n")  # fmt: skip
    fleet.shape(3, SLOW)
    try:
        proc = subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", "up", str(recipe), "--cluster",
                               str(fleet.cluster_file), "--name", "fabricmin"], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "NO_COLOR": "1"})  # fmt: skip
    finally:
        fleet.shape(3, FAST)
    assert proc.returncode != 0, proc.stdout
    said = proc.stderr + proc.stdout
    assert "the fabric failed the pair test that [verify] fabric_min_gbps asks for" in said, said
    named = {pair for pair in ("node0<->node3", "node3<->node1", "node1<->node3", "node2<->node3") if pair in said}
    assert len(named) == 3 and "expected ≥ 100.0 Mbit/s ([verify] fabric_min_gbps = 0.1)" in said, said
    assert "node0<->node1" not in said and "node1<->node2" not in said and "node0<->node2" not in said
    for i in range(4):
        assert fleet.processes(i).count("python3") == 0 and "iperf3" not in fleet.processes(i)
