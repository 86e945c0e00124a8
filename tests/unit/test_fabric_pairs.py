"""doctor --fabric's pure parts: the round-robin schedule, the parsers on captured real output
(tests/fixtures/fabric/README.md says how each was made), and the verdicts."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import pytest

from sparkfleet.doctor.pairs import PairResult, Thresholds, mtu_ladder, pair_tool, schedule, verdicts
from sparkfleet.nodes.linktest import (
    LocalLink,
    parse_client,
    parse_ib_write_bw,
    parse_ib_write_lat,
    parse_iperf3,
    parse_local,
    parse_mtu_probe,
    parse_ping,
    stream_throughput,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "fabric"


def _read(name: str) -> str:
    return (FIX / name).read_text()


@pytest.mark.parametrize("n", range(2, 10))
def test_schedule_meets_every_pair_once_and_no_node_twice_in_a_round(n: int) -> None:
    names = [f"n{i}" for i in range(n)]
    rounds = schedule(names)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [frozenset(p) for r in rounds for p in r]
    assert sorted(map(sorted, seen)) == sorted(map(sorted, map(frozenset, combinations(names, 2))))
    for r in rounds:
        busy = [x for p in r for x in p]
        assert len(busy) == len(set(busy))
        assert len(r) == n // 2  # everyone plays but the bye


def test_iperf3_bidir_json_gives_both_directions_and_retransmits() -> None:
    t = parse_iperf3(_read("iperf3-bidir-200mbit.json"))
    assert round(t.forward_bps / 1e6, 1) == 196.5 and round(t.reverse_bps / 1e6, 1) == 197.5
    assert (t.forward_retransmits, t.reverse_retransmits) == (0, 0)
    slow = parse_iperf3(_read("iperf3-bidir-20mbit.json"))
    assert round(slow.forward_bps / 1e6, 1) == 19.7 and slow.forward_retransmits == 81


def test_iperf3_error_is_its_own_message() -> None:
    with pytest.raises(ValueError, match="iperf3: unable to connect to server: Connection refused"):
        parse_iperf3(_read("iperf3-refused.json"))
    with pytest.raises(ValueError, match="no JSON: sh: iperf3: not found"):
        parse_iperf3("sh: iperf3: not found")


def test_ping_summary() -> None:
    clean = parse_ping(_read("ping-clean.txt"))
    assert (clean.sent, clean.received, clean.loss_pct, clean.rtt_avg_ms) == (100, 100, 0.0, 0.058)
    lossy = parse_ping(_read("ping-loss.txt"))
    assert (lossy.received, lossy.loss_pct) == (89, 11.0)
    dead = parse_ping(_read("ping-unreachable.txt"))
    assert (dead.loss_pct, dead.rtt_avg_ms) == (100.0, None)


def test_mtu_probes() -> None:
    assert parse_mtu_probe(9000, _read("mtu-pass.txt")).passed
    hole = parse_mtu_probe(9000, _read("mtu-blackhole.txt"))
    assert not hole.passed
    local = parse_mtu_probe(9001, _read("mtu-local-too-long.txt"))
    assert not local.passed


def test_client_sections_parse_each_tool() -> None:
    text = (
        "## iperf3\n" + _read("iperf3-bidir-20mbit.json") + "## ping\n" + _read("ping-loss.txt")
        + "## mtu 9000\n" + _read("mtu-blackhole.txt") + "## mtu 1500\n" + _read("mtu-pass.txt")
    )  # fmt: skip
    m = parse_client(text)
    assert m.throughput and round(m.throughput.forward_bps / 1e6) == 20
    assert m.ping and m.ping.loss_pct == 11.0
    assert [(p.size, p.passed) for p in m.mtu] == [(9000, False), (1500, True)] and m.errors == ()


def test_local_link() -> None:
    text = (
        "## if enp1s0f0np0\n2: enp1s0f0np0@if5: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc tbf state UP\n"
        "## iperf3\n/usr/bin/iperf3\n"
    )
    assert parse_local(text) == LocalLink("enp1s0f0np0", 9000, True)
    assert parse_local("## if \n## iperf3\n") == LocalLink(None, None, False)


def test_ib_write_bw_published_dgx_spark_output() -> None:
    bw = parse_ib_write_bw(_read("ib_write_bw-dgx-spark.txt"))
    assert (bw.peak_gbps, bw.average_gbps) == (111.72, 111.71)
    mbytes = _read("ib_write_bw-dgx-spark.txt").replace("[Gb/sec]", "[MB/sec]")  # without --report_gbits
    with pytest.raises(ValueError, match="not an ib_write_bw --report_gbits result line"):
        parse_ib_write_bw(mbytes)


def test_ib_write_lat_published_dgx_spark_output() -> None:
    lat = parse_ib_write_lat(_read("ib_write_lat-dgx-spark.txt"))
    assert (lat.typical_us, lat.p99_us) == (1.47, 1.57)
    with pytest.raises(ValueError):
        parse_ib_write_lat(_read("ib_write_bw-dgx-spark.txt"))


def _pair(a: str, b: str, fwd: float, rev: float, loss: float = 0.0, mtu: int | None = 9000) -> PairResult:
    return PairResult(a, b, "enp1s0f0np0", "enp1s0f0np0", 9000, fwd, rev, (0, 0), 0.05, loss, 50, mtu, (9000,))


def test_verdicts_name_the_slow_pairs_the_lossy_one_and_the_small_path_mtu() -> None:
    links = {n: LocalLink("enp1s0f0np0", 9000, True) for n in ("node0", "node1", "node2", "node3")}
    results = [
        _pair("node0", "node3", 19.6, 19.8), _pair("node1", "node2", 196.0, 197.0),
        _pair("node0", "node2", 196.0, 196.5, loss=6.0), _pair("node1", "node3", 19.7, 19.5),
        _pair("node0", "node1", 196.2, 196.1, mtu=1500), _pair("node2", "node3", 19.6, 19.7),
    ]  # fmt: skip
    fails = {(c.id, c.node): c for c in verdicts(results, links, Thresholds()) if c.status == "fail"}
    assert set(fails) == {
        ("fabric.bandwidth", "node0<->node3"), ("fabric.bandwidth", "node1<->node3"),
        ("fabric.bandwidth", "node2<->node3"), ("fabric.loss", "node0<->node2"), ("fabric.path_mtu", "node0<->node1"),
    }  # fmt: skip
    ev = fails[("fabric.bandwidth", "node0<->node3")].evidence
    assert ev.startswith("node0 enp1s0f0np0 → node3 enp1s0f0np0 19.6 Mbit/s; node3 enp1s0f0np0 → node0")
    assert "0.7 × the fleet's median" in ev
    assert "6% of 50 pings lost, expected ≤ 1%" in fails[("fabric.loss", "node0<->node2")].evidence
    mtu = fails[("fabric.path_mtu", "node0<->node1")].evidence
    assert "9000-byte don't-fragment packets are lost, 1500 passes" in mtu


def test_a_node_without_iperf3_is_measured_by_the_stream_test_and_warned_about() -> None:
    links = {"a": LocalLink("eth0", 1500, True), "b": LocalLink("eth0", 1500, False)}
    assert pair_tool(links["a"], links["b"]) == "stdlib" and pair_tool(links["a"], links["a"]) == "iperf3"
    assert pair_tool(links["a"], links["a"], "stdlib") == "stdlib"
    pair = PairResult(
        "a", "b", "eth0", "eth0", 1500, 940.0, 930.0, loss_pct=0.0, pings=50, path_mtu=1500, tool="stdlib"
    )
    checks = verdicts([pair], links)
    tool = [c for c in checks if c.id == "fabric.tool" and c.status == "warn"]
    assert [c.node for c in tool] == ["b"] and "apt-get install iperf3" in tool[0].fix
    assert "sparkfleet's stream test" in tool[0].evidence
    assert [c.status for c in checks if c.id == "fabric.bandwidth"] == ["pass"]


def test_stream_test_results_read_as_each_ends_received_rate() -> None:
    server = 'listening\n{"received": 250000000, "seconds": 2.0}\n'
    client = '{"received": 125000000, "seconds": 2.0}\n'
    t = stream_throughput(server, client)
    assert (t.forward_bps, t.reverse_bps) == (1e9, 5e8)  # what each end received, in bits/s
    with pytest.raises(ValueError, match="printed no result"):
        stream_throughput("listening\n", client)


def test_mtu_ladder() -> None:
    assert mtu_ladder(9000) == (9000, 1500, 1280) and mtu_ladder(1500) == (1500, 1280) and mtu_ladder(None) == (1500,)


def test_fabric_runs_are_kept_and_the_newest_read_back(tmp_path: Path) -> None:
    from sparkfleet.doctor.history import last_fabric, record_fabric
    from sparkfleet.state.store import Store

    store = Store(tmp_path / "state.db")
    assert last_fabric(store) is None
    record_fabric(store, {"ok": False, "pairs": [{"a": "node0", "b": "node3", "forward_mbps": 19.7}]}, 10.7)
    record_fabric(store, {"ok": True, "pairs": []}, 10.1, "recipes/x")
    last = last_fabric(store)
    assert last is not None and last["ok"] is True and last["recipe"] == "recipes/x" and last["run_at"] > 0


def test_a_recipe_minimum_fails_pairs_the_median_would_pass() -> None:
    from pydantic import ValidationError

    from sparkfleet.config.recipe import Verify

    links = {n: LocalLink("eth0", 9000, True) for n in ("a", "b", "c")}
    results = [_pair("a", "b", 60.0, 61.0), _pair("a", "c", 59.0, 60.0), _pair("b", "c", 60.5, 60.0)]
    assert not [c for c in verdicts(results, links, Thresholds()) if c.status == "fail"]
    fails = [c for c in verdicts(results, links, Thresholds(min_mbps=100.0)) if c.status == "fail"]
    assert {c.node for c in fails} == {"a<->b", "a<->c", "b<->c"}
    assert all("expected ≥ 100.0 Mbit/s ([verify] fabric_min_gbps = 0.1)" in c.evidence for c in fails)
    assert Verify(fabric_min_gbps=100).fabric_min_gbps == 100
    with pytest.raises(ValidationError):
        Verify(fabric_min_gbps=0)


def test_a_node_that_does_not_answer_fails_once_not_on_every_pair() -> None:
    links = {"a": LocalLink("eth0", 1500, True), "b": LocalLink(None, None, False, "ssh: connect to host b: timed out")}
    checks = verdicts([PairResult("a", "b", "eth0", None, 1500)], links)
    assert [(c.id, c.node, c.status) for c in checks] == [("fabric.tool", "a", "pass"), ("fabric.node", "b", "fail")]
    assert "timed out" in checks[1].evidence
