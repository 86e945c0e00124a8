"""doctor --fabric's RDMA and link-speed parts: the link facts (sysfs speed, a tc-shaped rate, the
RDMA port's rate and PCIe link) read by their real commands from trees laid out as the kernel's,
perftest's client output split and parsed (the committed DGX Spark captures), and the verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfleet.doctor.pairs import (
    FabricReport,
    PairResult,
    RdmaEnd,
    Thresholds,
    link_speed_check,
    rdma_check,
    rdma_end,
    render_matrix,
    verdicts,
)
from sparkfleet.doctor.probes import rdma
from sparkfleet.nodes.linktest import (
    LAT_SECTION,
    LocalLink,
    parse_local,
    parse_perftest_client,
    parse_tc_rate,
    perftest_argv,
)
from sparkfleet.nodes.transport.local import LocalTransport
from tests.fleet.connectx import write_dev, write_port

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "fabric"
BW, LAT = (FIX / "ib_write_bw-dgx-spark.txt").read_text(), (FIX / "ib_write_lat-dgx-spark.txt").read_text()


def test_local_link_reads_speed_shaping_and_perftest() -> None:
    text = ("## if enp1s0f0np0\n3: enp1s0f0np0: <UP> mtu 9000 qdisc tbf state UP\n## iperf3\n/usr/bin/iperf3\n"
            "## speed\n10000\n## qdisc\nqdisc tbf 8001: root refcnt 2 rate 200Mbit burst 64Kb lat 50ms \n"
            "## perftest\n/usr/bin/ib_write_bw\n/usr/bin/ib_write_lat\n")  # fmt: skip
    link = parse_local(text)
    assert (link.speed_mbps, link.shaped_mbps, link.has_perftest, link.link_mbps) == (10000, 200.0, True, 200.0)
    text = "## if eth0\n## speed\n-1\n## qdisc\nqdisc noqueue 0: root refcnt 2\n## perftest\n/x/ib_write_bw\n"
    unknown = parse_local(text)
    assert (unknown.speed_mbps, unknown.shaped_mbps, unknown.has_perftest) == (None, None, False)
    assert unknown.link_mbps is None


@pytest.mark.parametrize(("line", "mbps"), [
    ("qdisc tbf 8001: root refcnt 2 rate 200Mbit burst 64Kb lat 50ms", 200.0),
    ("qdisc tbf 1: root refcnt 2 rate 2Gbit burst 1Mb lat 50ms", 2000.0),
    ("qdisc tbf 1: root refcnt 2 rate 512Kbit burst 16Kb lat 50ms", 0.512),
    ("qdisc tbf 10: parent 1:1 rate 200Mbit burst 64Kb lat 50ms", None),  # not the root
    ("qdisc htb 1: root refcnt 2 r2q 10 default 0", None),  # htb's rates live in its classes
])  # fmt: skip
def test_tc_rate(line: str, mbps: float | None) -> None:
    assert parse_tc_rate(line) == mbps


def test_rdma_fact_reads_port_rate_and_pcie_link(tmp_path: Path) -> None:
    write_port(tmp_path / "sys", "rocep1s0f0", "enp1s0f0np0", ("192.168.200.11",))
    write_port(tmp_path / "sys", "mlx5_0", "ens1np0", ("10.1.0.1",), rate="400 Gb/sec (4X NDR)",
               pcie=("32.0 GT/s PCIe", "16"))  # fmt: skip
    write_dev(tmp_path / "dev", 2)
    facts = rdma.parse(LocalTransport().run(rdma.command(str(tmp_path / "sys"), str(tmp_path / "dev"))).stdout)
    spark, big = (facts.port_for_ip(ip) for ip in ("192.168.200.11", "10.1.0.1"))
    assert spark is not None and big is not None
    assert spark.rate_gbps == 200.0 and facts.expected_gbps(spark) == pytest.approx(126.03, abs=0.01)  # x4 caps it
    assert big.rate_gbps == 400.0 and facts.expected_gbps(big) == 400.0  # x16 (504 Gbit/s) does not
    end = rdma_end(facts, "192.168.200.11")
    assert end is not None and (end.hca, end.port, end.gid_index) == ("rocep1s0f0", 1, 3)
    assert rdma.pcie_gbps("2.5 GT/s PCIe", "8") == 16.0 and rdma.pcie_gbps("Unknown", "0") is None
    assert rdma.parse_rate("2.5 Gb/sec (1X SDR)") == 2.5 and rdma.parse_rate("") is None


def test_rdma_end_needs_an_active_port_with_a_roce_v2_gid_of_the_address(tmp_path: Path) -> None:
    write_port(tmp_path / "sys", "rocep1s0f1", "enp1s0f1np1", ("192.168.200.12",), state="1: DOWN")
    facts = rdma.parse(LocalTransport().run(rdma.command(str(tmp_path / "sys"), str(tmp_path / "dev"))).stdout)
    assert rdma_end(facts, "192.168.200.12") is None and rdma_end(facts, "192.168.200.99") is None
    assert rdma_end(None, "192.168.200.12") is None


def test_perftest_client_output_parsed_from_the_captures() -> None:
    m = parse_perftest_client(f"{BW}{LAT_SECTION}\n{LAT}")
    assert m.bandwidth is not None and m.bandwidth.average_gbps == 111.71
    assert m.latency is not None and m.latency.typical_us == 1.47 and m.errors == ()
    refused = parse_perftest_client(" Couldn't connect to 192.168.200.12:18515\n")
    assert refused.bandwidth is None and refused.errors == ("ib_write_bw: Couldn't connect to 192.168.200.12:18515",)


def test_perftest_argv_names_the_hca_its_gid_and_its_port() -> None:
    assert perftest_argv("ib_write_bw", "rocep1s0f0", 3, 18515) == [
        "ib_write_bw",
        "-d",
        "rocep1s0f0",
        "-x",
        "3",
        "-F",
        "-p",
        "18515",
        "--report_gbits",
        "-q",
        "4",
        "-n",
        "5000",
    ]
    assert perftest_argv("ib_write_lat", "rocep1s0f0", 3, 18516)[-2:] == ["-n", "1000"]  # fmt: skip


def _pair(**kw: object) -> PairResult:
    base: dict[str, object] = dict(a="n0", b="n1", a_if="enp1s0f0np0", b_if="enp1s0f0np0", mtu_expected=9000,
                                   forward_mbps=9400.0, reverse_mbps=9350.0, rtt_ms=0.05, loss_pct=0.0, pings=50,
                                   path_mtu=9000, mtu_tried=(9000,), tool="iperf3", link_mbps=10000.0)  # fmt: skip
    return PairResult(**{**base, **kw})  # type: ignore[arg-type]


def test_link_speed_judges_tcp_on_links_up_to_25_gbit_only() -> None:
    th = Thresholds()
    ok = link_speed_check(_pair(), th)
    assert ok is not None and ok.status == "pass"
    slow = link_speed_check(_pair(forward_mbps=2500.0), th)
    assert slow is not None and slow.status == "fail"
    assert (
        "n0 enp1s0f0np0 → n1 enp1s0f0np0 2500.0 Mbit/s, expected ≥ 7000.0 Mbit/s (0.7 × the link's own speed "
        "10000 Mbit/s)" in slow.evidence
    )
    assert link_speed_check(_pair(link_mbps=200_000.0, forward_mbps=30_000.0), th) is None  # one stream, 200G
    assert link_speed_check(_pair(link_mbps=None), th) is None  # speed -1 / unknown


def test_rdma_verdict_against_what_the_hcas_carry_and_the_fleet_median() -> None:
    th = Thresholds()
    rd = dict(rdma_hcas=("rocep1s0f0", "rocep1s0f1"), rdma_gids=(3, 3), rdma_expected_gbps=126.03, rdma_lat_us=1.47,
              rdma_lat_p99_us=1.57)  # fmt: skip
    good = rdma_check(_pair(rdma_gbps=111.71, **rd), th, 111.71)
    assert good is not None and good.status == "pass"
    slow = rdma_check(_pair(rdma_gbps=11.17, **rd), th, 111.71)
    assert slow is not None and slow.status == "fail"
    assert slow.evidence.startswith(
        "n0 rocep1s0f0 (GID 3, enp1s0f0np0) → n1 rocep1s0f1 (GID 3, enp1s0f0np0): "
        "ib_write_bw 11.17 Gbit/s, expected ≥ 88.22 Gbit/s (0.7 × 126.0 Gbit/s"
    )
    gone = rdma_check(_pair(rdma_gbps=None, rdma_errors=("ib_write_bw: Couldn't connect",), **rd), th, None)
    assert gone is not None and gone.status == "fail" and "Couldn't connect" in gone.evidence
    assert rdma_check(_pair(), th, None) is None  # no RDMA test on this pair


def test_a_node_with_an_hca_but_no_perftest_is_warned_about() -> None:
    links = {"n0": LocalLink("enp1s0f0np0", 9000, True, None, 200000, None, False),
             "n1": LocalLink("enp1s0f0np0", 9000, True, None, 200000, None, True)}  # fmt: skip
    end = RdmaEnd("rocep1s0f0", 1, 3, 200.0, 126.0)
    checks = verdicts([_pair(link_mbps=200000.0)], links, Thresholds(), {"n0": end, "n1": end})
    tool = {c.node: c for c in checks if c.id == "fabric.rdma_tool"}
    assert tool["n0"].status == "warn" and "apt-get install perftest" in tool["n0"].fix
    assert tool["n1"].status == "pass"


def test_both_matrices_mark_the_slow_cells_and_leave_unmeasured_ones_apart() -> None:
    pairs = (
        _pair(a="n0", b="n1", rdma_hcas=("h0", "h1"), rdma_gbps=111.7, rdma_expected_gbps=126.0),
        _pair(a="n0", b="n2", forward_mbps=900.0, rdma_hcas=("h0", "h2"), rdma_gbps=11.2, rdma_expected_gbps=126.0),
        _pair(a="n1", b="n2", forward_mbps=None),
    )
    lines = render_matrix(FabricReport(("n0", "n1", "n2"), (), pairs, (), 1.0, 2))
    tcp = lines[: lines.index(next(x for x in lines if x.startswith("RDMA write")))]
    rdma = lines[len(tcp) :]
    assert tcp[2].split() == ["n0", "-", "9.40", "0.90*"] and tcp[3].split() == ["n1", "9.35", "-", "n/a"]
    assert rdma[2].split() == ["n0", "-", "111.70", "11.20*"]  # a tenth of what the HCAs carry
    assert rdma[3].split() == ["n1", "-"]  # n1 → n2 has no RDMA test: an empty cell, not "n/a"
