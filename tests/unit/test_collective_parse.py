"""The collective sweep's pure half (doctor/collective.py) on output captured on the H200
(tests/fixtures/nccl/README.md) and on NCCL's transport lines as its source prints them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfleet.doctor.collective import (
    CollectiveReport,
    RankOutcome,
    judge,
    parse_nccl,
    parse_rank,
    render_collective,
    slowest_link,
    sweep_sizes,
    transport_name,
)
from sparkfleet.nodes.collective import rank_python
from sparkfleet.nodes.shipped.collective_sweep import bus_factor, iterations

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"
WORLD1 = (FIXTURES / "h200-torch2.11-nccl2.28.9-world1.out").read_text()
DUPLICATE = (FIXTURES / "h200-two-ranks-one-gpu-rank0.out").read_text()


def test_sizes_grow_by_four_from_1_kib_and_end_at_the_largest() -> None:
    assert sweep_sizes(1 << 30) == tuple(1 << s for s in range(10, 31, 2))
    assert sweep_sizes(3 << 20)[-2:] == (1 << 20, 3 << 20)
    assert sweep_sizes(100) == (1024,)


def test_iterations_depend_on_the_size_alone_and_bus_factors_are_nccl_tests() -> None:
    # Every rank computes the same count: a collective called a different number of times hangs.
    assert iterations(1024) == 50 and iterations(1 << 30) == 3 and iterations(16 << 20) == 4
    assert bus_factor("all_reduce", 2) == 1.0 and bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("all_gather", 2) == 0.5 and bus_factor("all_gather", 4) == 0.75
    assert bus_factor("all_reduce", 1) == 0.0


def test_the_h200_capture_reads_as_nccl_on_the_gpu_with_its_rows() -> None:
    header, rows, error = parse_rank(WORLD1)
    assert error is None and header["backend"] == "nccl" and header["device"] == "cuda:0"
    assert [(r.op, r.bytes) for r in rows][:2] == [("all_reduce", 1024), ("all_gather", 1024)]
    assert len(rows) == 8 and {r.bytes for r in rows} == {1024, 1 << 20, 64 << 20, 1 << 30}
    assert all(r.busbw_gbps == 0.0 for r in rows)  # one rank: nothing crosses a link
    # NCCL's network is Socket there (no IB device); 64 "Channel NN/64 : 0" lines of one rank are
    # rings, not connections: no transport is counted.
    network, used = parse_nccl(WORLD1)
    assert network == "Socket" and used == {}


def test_an_nccl_refusal_is_one_line_naming_its_reason() -> None:
    header, rows, error = parse_rank(DUPLICATE)
    assert rows == [] and header["rank"] == 0
    assert error == "NCCL: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60"
    checks = judge([RankOutcome(0, "spark1", "nccl", "cuda:0", error)], [])
    assert [(c.status, c.node) for c in checks] == [("fail", "spark1")] and "Duplicate GPU" in checks[0].evidence


@pytest.mark.parametrize(
    ("via", "name"),
    [
        ("NET/IB/0/GDRDMA", "NET/IB/GDRDMA"),
        ("NET/IB/1(3)/GDRDMA/Shared", "NET/IB/GDRDMA/Shared"),
        ("NET/Socket/0", "NET/Socket"),
        ("NET/IBext_v8/7/GDRDMA", "NET/IBext_v8/GDRDMA"),
        ("P2P/CUMEM/read", "P2P/CUMEM"),
        ("SHM/direct/direct", "SHM/direct"),
    ],
)
def test_transport_names_drop_what_differs_per_channel(via: str, name: str) -> None:
    assert transport_name(via) == name


def test_channel_connections_are_counted_per_transport() -> None:
    # Shaped as NCCL's transport/net.cc and p2p.cc print them (INFO, NCCL_DEBUG=INFO).
    log = "\n".join([
        "spark1:4242:4300 [0] NCCL INFO Using network IB",
        "spark1:4242:4300 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
        "spark1:4242:4300 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1/GDRDMA",
        "spark1:4242:4300 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
        "spark1:4242:4300 [0] NCCL INFO Channel 00/1 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "spark1:4242:4300 [0] NCCL INFO Channel 00/32 :    0   1",
    ])  # fmt: skip
    network, used = parse_nccl(log)
    assert network == "IB" and used == {"NET/IB/GDRDMA": 3, "P2P/CUMEM": 1}


def test_the_peak_is_set_beside_the_slowest_pair_among_the_ranks_nodes() -> None:
    fabric = {"pairs": [
        {"a": "spark1", "b": "spark2", "forward_mbps": 180_000.0, "reverse_mbps": 176_000.0},
        {"a": "spark1", "b": "spark3", "forward_mbps": 90_000.0, "reverse_mbps": 91_000.0},
    ]}  # fmt: skip
    assert slowest_link(fabric, ["spark1", "spark2"]) == 176.0
    assert slowest_link(fabric, ["spark1", "spark2", "spark3"]) == 90.0
    assert slowest_link(None, ["spark1"]) is None
    _, rows, _ = parse_rank(WORLD1)
    peak = rows[-2]  # 1 GiB all-reduce, set to 11 GB/s bus below
    rows = [*rows[:-2], type(peak)(peak.op, peak.bytes, peak.iters, peak.time_us, 11.0, 11.0), rows[-1]]
    report = CollectiveReport((RankOutcome(0, "spark1", "nccl", "cuda:0", None),), tuple(rows), "IB",
                              (("NET/IB/GDRDMA", 3),), 176.0, "doctor --fabric, this run", (), 1.0)  # fmt: skip
    text = "\n".join(render_collective(report))
    assert "all-reduce at 1 GiB: bus 88 Gbit/s = 0.50 × the slowest fabric pair's 176 Gbit/s" in text
    assert "NCCL transport: NET/IB/GDRDMA (3 channel connections); network IB" in text


def test_the_rank_python_is_the_engines() -> None:
    assert rank_python(("/opt/venv/bin/vllm", "serve"), "python3") == "/opt/venv/bin/python"
    assert rank_python(("/usr/bin/python3.12", "-m", "sglang.launch_server"), "python3") == "/usr/bin/python3.12"
    assert rank_python(("vllm", "serve"), "/usr/bin/python3") == "/usr/bin/python3"
