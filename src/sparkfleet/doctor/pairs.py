"""`doctor --fabric`: every pair of nodes measured over the fabric, in rounds, and judged.

A round-robin schedule (the circle method) puts every pair in exactly one round and no node in two
tests of one round: N−1 rounds for N nodes, N rounds with a bye each when N is odd. Each round's
pairs run at once (nodes/linktest.measure_pair); the verdicts are a pure function of the
measurements:

    fabric.bandwidth   each direction of each pair at ≥ fraction × the fleet's median (default 0.7)
    fabric.loss        ping loss ≤ max_loss_pct (default 1 %)
    fabric.path_mtu    a don't-fragment packet of the source interface's MTU is answered
    fabric.link_speed  each TCP direction at ≥ fraction × the link's own speed (the smaller end's
                       reported speed, or the rate a root tbf qdisc shapes it to), judged only on
                       links of ≤ 25 Gbit/s: one TCP stream does not fill a faster link
    fabric.rdma        where both nodes have an ACTIVE HCA carrying their fabric address and
                       perftest: ib_write_bw from a's HCA to b's at ≥ fraction × what the HCAs can
                       carry (port rate, capped by the HCA's PCIe link) and ≥ fraction × the
                       fleet's RDMA median; ib_write_lat's figures beside it
    fabric.rdma_tool   a node with such an HCA has ib_write_bw and ib_write_lat (Debian's perftest)
    fabric.tool        iperf3 is installed on the node (without it, or with tool="stdlib", the pair's
                       bandwidth comes from the stream test shipped to the nodes: a warning)
    fabric.node        the node answered (SSH); a node that did not fails here, its pairs are skipped
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from sparkfleet.doctor.probes import rdma as rdma_probe
from sparkfleet.doctor.targets import Check, NodeTarget
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.linktest import (
    IPERF3_PORT,
    PERFTEST_PORT,
    LocalLink,
    PairMeasurement,
    RdmaMeasurement,
    RdmaServer,
    local_command,
    measure_pair,
    measure_rdma,
    parse_local,
)
from sparkfleet.nodes.transport.base import Transport

IPERF3_FIX = "install iperf3 on the node (Debian/Ubuntu: apt-get install iperf3; scripts/setup-system.sh does)"
PERFTEST_FIX = "install perftest on the node (Debian/Ubuntu: apt-get install perftest)"
TCP_LINK_SPEED_MAX_MBPS = 25_000.0  # above this, one TCP stream is no measure of the link: RDMA's is


@dataclass(frozen=True)
class RdmaEnd:
    """A node's HCA port for the pair test: the ACTIVE port whose GID table carries its fabric address."""

    hca: str
    port: int
    gid_index: int
    rate_gbps: float | None
    expected_gbps: float | None  # the port rate, capped by the HCA's PCIe link


def rdma_end(facts: rdma_probe.RdmaFacts | None, fabric_ip: str) -> RdmaEnd | None:
    """The node's RDMA end on its fabric address, or None (no such port, not ACTIVE, no RoCE v2 GID)."""
    port = facts.port_for_ip(fabric_ip) if facts is not None else None
    gid = port.roce_v2_index(fabric_ip) if port is not None and port.active else None
    if facts is None or port is None or gid is None:
        return None
    return RdmaEnd(port.hca, port.port, gid, port.rate_gbps, facts.expected_gbps(port))


def schedule(names: Sequence[str]) -> tuple[tuple[tuple[str, str], ...], ...]:
    """Rounds of pairs: every pair once, no node twice in a round (circle method; odd N: a bye)."""
    slots: list[str | None] = list(names)
    if len(slots) % 2:
        slots.append(None)
    n = len(slots)
    rounds = []
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = slots[i], slots[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((a, b))
        rounds.append(tuple(pairs))
        slots = [slots[0], slots[-1], *slots[1:-1]]  # keep the first, rotate the rest
    return tuple(r for r in rounds if r)


@dataclass(frozen=True)
class Thresholds:
    fraction: float = 0.7
    max_loss_pct: float = 1.0
    min_mbps: float | None = None  # an absolute floor besides the median's ([verify] fabric_min_gbps)


@dataclass(frozen=True)
class PairResult:
    """One pair: a (source) and b (target), their fabric interfaces, and what was measured."""

    a: str
    b: str
    a_if: str | None
    b_if: str | None
    mtu_expected: int | None
    forward_mbps: float | None = None  # a → b
    reverse_mbps: float | None = None  # b → a
    retransmits: tuple[int, int] | None = None
    rtt_ms: float | None = None
    loss_pct: float | None = None
    pings: int | None = None
    path_mtu: int | None = None  # the largest don't-fragment size answered (None: none was)
    mtu_tried: tuple[int, ...] = ()
    errors: tuple[str, ...] = ()
    tool: str | None = None  # what measured the bandwidth: iperf3, stdlib (the shipped stream test)
    link_mbps: float | None = None  # the link's own speed: the smaller end's (reported, or shaped by tc)
    rdma_hcas: tuple[str, str] | None = None  # a's HCA, b's HCA (None: the pair has no RDMA test)
    rdma_gids: tuple[int, int] | None = None
    rdma_gbps: float | None = None  # ib_write_bw's average, a writes to b
    rdma_peak_gbps: float | None = None
    rdma_expected_gbps: float | None = None  # the smaller end's port rate, capped by its PCIe link
    rdma_lat_us: float | None = None  # ib_write_lat's typical one-way latency
    rdma_lat_p99_us: float | None = None
    rdma_errors: tuple[str, ...] = ()


def mtu_ladder(mtu: int | None) -> tuple[int, ...]:
    """The don't-fragment sizes tried, largest first: the interface MTU, then 1500 and 1280."""
    if not mtu:
        return (1500,)
    return tuple(dict.fromkeys(s for s in (mtu, 1500, 1280) if s <= mtu))


def pair_tool(la: LocalLink, lb: LocalLink, wanted: str = "auto") -> str:
    """What measures a pair's bandwidth: iperf3 where both nodes have it (auto), else the stream test."""
    if wanted == "stdlib" or (wanted == "auto" and not (la.has_iperf3 and lb.has_iperf3)):
        return "stdlib"
    return "iperf3"


def _smaller(*xs: float | None) -> float | None:
    known = [x for x in xs if x]
    return min(known) if known else None


def pair_result(a: str, b: str, la: LocalLink, lb: LocalLink, m: PairMeasurement, tool: str | None = None,
                rdma: tuple[RdmaEnd, RdmaEnd, RdmaMeasurement] | None = None) -> PairResult:  # fmt: skip
    """A pair's figures from its measurements."""
    extra: dict[str, object] = {"link_mbps": _smaller(la.link_mbps, lb.link_mbps)}
    if rdma is not None:
        ea, eb, rm = rdma
        bw, lat = rm.bandwidth, rm.latency
        extra.update(rdma_hcas=(ea.hca, eb.hca), rdma_gids=(ea.gid_index, eb.gid_index),
                     rdma_gbps=bw.average_gbps if bw else None, rdma_peak_gbps=bw.peak_gbps if bw else None,
                     rdma_expected_gbps=_smaller(ea.expected_gbps, eb.expected_gbps),
                     rdma_lat_us=lat.typical_us if lat else None, rdma_lat_p99_us=lat.p99_us if lat else None,
                     rdma_errors=rm.errors)  # fmt: skip
    t, p = m.throughput, m.ping
    answered = [probe.size for probe in m.mtu if probe.passed]
    return PairResult(
        a=a, b=b, a_if=la.ifname, b_if=lb.ifname, mtu_expected=la.mtu,
        forward_mbps=t.forward_bps / 1e6 if t else None, reverse_mbps=t.reverse_bps / 1e6 if t else None,
        retransmits=(t.forward_retransmits, t.reverse_retransmits) if t else None,
        rtt_ms=p.rtt_avg_ms if p else None, loss_pct=p.loss_pct if p else None, pings=p.sent if p else None,
        path_mtu=max(answered) if answered else None, mtu_tried=tuple(probe.size for probe in m.mtu), errors=m.errors,
        tool=tool, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def _pair(r: PairResult) -> str:
    return f"{r.a}<->{r.b}"


def _ends(r: PairResult, forward: bool = True) -> str:
    a, b = (f"{r.a} {r.a_if or '?'}", f"{r.b} {r.b_if or '?'}")
    return f"{a} → {b}" if forward else f"{b} → {a}"


def median_mbps(results: Sequence[PairResult]) -> float | None:
    """The fleet's median rate over every measured direction of every pair."""
    rates = [x for r in results for x in (r.forward_mbps, r.reverse_mbps) if x is not None]
    return statistics.median(rates) if rates else None


def median_rdma_gbps(results: Sequence[PairResult]) -> float | None:
    """The fleet's median ib_write_bw rate over every pair measured over RDMA."""
    rates = [r.rdma_gbps for r in results if r.rdma_gbps is not None]
    return statistics.median(rates) if rates else None


def _rdma_ends(r: PairResult) -> str:
    ha, hb = r.rdma_hcas or ("?", "?")
    ga, gb = r.rdma_gids or ("?", "?")
    return f"{r.a} {ha} (GID {ga}, {r.a_if or '?'}) → {r.b} {hb} (GID {gb}, {r.b_if or '?'})"


def link_speed_check(r: PairResult, th: Thresholds) -> Check | None:
    """fabric.link_speed of one pair's TCP figures (None: not judged: speed unknown, link above
    TCP_LINK_SPEED_MAX_MBPS, or not measured)."""
    if r.link_mbps is None or r.forward_mbps is None or r.reverse_mbps is None:
        return None
    if r.link_mbps > TCP_LINK_SPEED_MAX_MBPS:
        return None
    floor = th.fraction * r.link_mbps
    slow = [(fwd, rate) for fwd, rate in ((True, r.forward_mbps), (False, r.reverse_mbps)) if rate < floor]
    why = f"{th.fraction:g} × the link's own speed {r.link_mbps:g} Mbit/s"
    if slow:
        said = "; ".join(f"{_ends(r, fwd)} {rate:.1f} Mbit/s" for fwd, rate in slow)
        return Check("fabric.link_speed", _pair(r), "fail", f"{said}, expected ≥ {floor:.1f} Mbit/s ({why})",
                     "compare both ends' negotiated speed (ethtool IF), the switch ports' and any shaping "
                     "(tc qdisc show dev IF); reseat or replace the cable")  # fmt: skip
    return Check(
        "fabric.link_speed",
        _pair(r),
        "pass",
        f"{_ends(r)} {r.forward_mbps:.1f} Mbit/s, back {r.reverse_mbps:.1f} Mbit/s, ≥ {why}",
    )


def rdma_check(r: PairResult, th: Thresholds, median: float | None) -> Check | None:
    """fabric.rdma of one pair (None: the pair had no RDMA test)."""
    if r.rdma_hcas is None:
        return None
    pair = _pair(r)
    if r.rdma_gbps is None:
        why = "; ".join(r.rdma_errors) or "no result"
        return Check(
            "fabric.rdma",
            pair,
            "fail",
            f"{_rdma_ends(r)}: ib_write_bw not measured: {why}",
            "run ib_write_bw by hand on both nodes (show_gids for the GID index; ibv_devinfo for the port)",
        )
    floors = []
    if r.rdma_expected_gbps:
        floors.append((th.fraction * r.rdma_expected_gbps,
                       f"{th.fraction:g} × {r.rdma_expected_gbps:.1f} Gbit/s, what the HCAs can carry "
                       "(port rate, capped by the HCA's PCIe link)"))  # fmt: skip
    if median is not None:
        floors.append((th.fraction * median, f"{th.fraction:g} × the fleet's RDMA median {median:.2f} Gbit/s"))
    if th.min_mbps is not None:
        floors.append((th.min_mbps / 1000, f"[verify] fabric_min_gbps = {th.min_mbps / 1000:g}"))
    lat = f", latency {r.rdma_lat_us:.2f} µs (p99 {r.rdma_lat_p99_us:.2f})" if r.rdma_lat_us is not None else ""
    missed = [(floor, why) for floor, why in floors if r.rdma_gbps < floor]
    if missed:
        floor, why = max(missed)
        return Check("fabric.rdma", pair, "fail",
                     f"{_rdma_ends(r)}: ib_write_bw {r.rdma_gbps:.2f} Gbit/s, expected ≥ {floor:.2f} Gbit/s ({why})"
                     f"{lat}",
                     "check this pair's cables, ports and switch port speed (ibv_devinfo, ethtool IF), and the "
                     "HCA's PCIe link (lspci -vv: LnkSta)")  # fmt: skip
    floor, why = max(floors) if floors else (0.0, "no expectation known")
    return Check("fabric.rdma", pair, "pass", f"{_rdma_ends(r)}: ib_write_bw {r.rdma_gbps:.2f} Gbit/s, "
                 f"≥ {floor:.2f} ({why}){lat}")  # fmt: skip


def verdicts(
    results: Sequence[PairResult],
    links: Mapping[str, LocalLink],
    th: Thresholds = Thresholds(),
    rdma_ends: Mapping[str, RdmaEnd | None] | None = None,
) -> tuple[Check, ...]:
    """Every pair's checks, and a fabric.tool (and fabric.rdma_tool) check per node."""
    checks: list[Check] = []
    for node, end in (rdma_ends or {}).items():
        if end is None or links[node].error is not None:
            continue
        hca = f"{end.hca}/{end.port} ACTIVE, RoCE v2 GID {end.gid_index}"
        if links[node].has_perftest:
            checks.append(Check("fabric.rdma_tool", node, "pass", f"ib_write_bw, ib_write_lat installed; {hca}"))
        else:
            checks.append(Check("fabric.rdma_tool", node, "warn", f"{hca}, but ib_write_bw / ib_write_lat not "
                                "found: its pairs are not measured over RDMA", PERFTEST_FIX))  # fmt: skip
    for node, link in links.items():
        if link.error is not None:
            checks.append(Check("fabric.node", node, "fail", f"no answer: {link.error}; its pairs are not measured"))
        elif link.has_iperf3:
            checks.append(Check("fabric.tool", node, "pass", "iperf3 installed"))
        else:
            checks.append(Check("fabric.tool", node, "warn", "iperf3 not found on the node: its pairs' bandwidth is "
                                "measured by sparkfleet's stream test (Python, one stream each way: below line rate "
                                "on links faster than a few Gbit/s)", IPERF3_FIX))  # fmt: skip
    median = median_mbps(results)
    rdma_median = median_rdma_gbps(results)
    for r in results:
        if links[r.a].error is not None or links[r.b].error is not None:
            continue  # the node's own failure says it
        pair = _pair(r)
        # bandwidth
        if r.forward_mbps is None or r.reverse_mbps is None:
            why = "; ".join(r.errors) or "no result"
            checks.append(Check("fabric.bandwidth", pair, "fail", f"{_ends(r)}: not measured: {why}"))
        elif median is not None:
            floor, why = th.fraction * median, f"{th.fraction:g} × the fleet's median {median:.1f} Mbit/s"
            if th.min_mbps is not None and th.min_mbps > floor:
                floor, why = th.min_mbps, f"[verify] fabric_min_gbps = {th.min_mbps / 1000:g}"
            slow = [(fwd, rate) for fwd, rate in ((True, r.forward_mbps), (False, r.reverse_mbps)) if rate < floor]
            if slow:
                said = "; ".join(f"{_ends(r, fwd)} {rate:.1f} Mbit/s" for fwd, rate in slow)
                checks.append(Check("fabric.bandwidth", pair, "fail", f"{said}, expected ≥ {floor:.1f} Mbit/s ({why})",
                                    "check this pair's cables, ports and switch port speed (ethtool IF)"))  # fmt: skip
            else:
                said = f"{_ends(r)} {r.forward_mbps:.1f} Mbit/s, back {r.reverse_mbps:.1f} Mbit/s"
                checks.append(Check("fabric.bandwidth", pair, "pass", said))
        checks += [c for c in (link_speed_check(r, th), rdma_check(r, th, rdma_median)) if c is not None]
        # loss and RTT
        if r.loss_pct is None:
            checks.append(Check("fabric.loss", pair, "fail", f"{_ends(r)}: ping gave no statistics"))
        elif r.loss_pct > th.max_loss_pct:
            checks.append(Check("fabric.loss", pair, "fail",
                                f"{_ends(r)}: {r.loss_pct:g}% of {r.pings} pings lost, expected ≤ {th.max_loss_pct:g}%",
                                "look for errors on both interfaces (ip -s link) and on the switch port"))  # fmt: skip
        else:
            rtt = f", RTT {r.rtt_ms:.3f} ms" if r.rtt_ms is not None else ""
            checks.append(Check("fabric.loss", pair, "pass", f"{_ends(r)}: {r.loss_pct:g}% of {r.pings} lost{rtt}"))
        # path MTU
        if r.mtu_expected is None:
            checks.append(Check("fabric.path_mtu", pair, "fail", f"{r.a}: no interface holds its fabric address"))
        elif r.path_mtu is None or r.path_mtu < r.mtu_expected:
            measured = f"{r.path_mtu} passes" if r.path_mtu else f"none of {', '.join(map(str, r.mtu_tried))} passes"
            checks.append(Check("fabric.path_mtu", pair, "fail",
                                f"{_ends(r)}: {r.mtu_expected}-byte don't-fragment packets are lost, {measured}; "
                                f"the interface MTU is {r.mtu_expected}",
                                "set one MTU on both interfaces and every switch port between them"))  # fmt: skip
        else:
            checks.append(Check("fabric.path_mtu", pair, "pass", f"{_ends(r)}: {r.path_mtu} bytes unfragmented"))
    return tuple(checks)


@dataclass(frozen=True)
class FabricReport:
    """The pair test: the schedule, every pair's figures, the verdicts, and how long it took."""

    nodes: tuple[str, ...]
    rounds: tuple[tuple[tuple[str, str], ...], ...]
    pairs: tuple[PairResult, ...]
    checks: tuple[Check, ...]
    seconds: float
    seconds_per_test: int
    thresholds: Thresholds = field(default_factory=Thresholds)

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == "fail")

    def to_json(self) -> dict[str, object]:
        return {
            "ok": not self.failed,
            "seconds": round(self.seconds, 3),
            "seconds_per_test": self.seconds_per_test,
            "median_mbps": median_mbps(self.pairs),
            "rdma_median_gbps": median_rdma_gbps(self.pairs),
            "thresholds": asdict(self.thresholds),
            "nodes": list(self.nodes),
            "rounds": [[list(p) for p in r] for r in self.rounds],
            "pairs": [asdict(p) for p in self.pairs],
            "checks": [asdict(c) for c in self.checks],
        }


def rate_matrix(nodes: Sequence[str], pairs: Sequence[PairResult]) -> dict[tuple[str, str], float | None]:
    """(source, destination) → Mbit/s."""
    out: dict[tuple[str, str], float | None] = {}
    for p in pairs:
        out[(p.a, p.b)], out[(p.b, p.a)] = p.forward_mbps, p.reverse_mbps
    return out


def render_matrix(report: FabricReport) -> list[str]:
    """The bandwidth matrix (row sends, column receives) and one line per pair with RTT, loss, MTU."""
    nodes = report.nodes
    rates = rate_matrix(nodes, report.pairs)
    median = median_mbps(report.pairs)
    gbit = median is not None and median >= 1000
    unit, scale = ("Gbit/s", 1e-3) if gbit else ("Mbit/s", 1.0)
    floor = median * report.thresholds.fraction if median else None

    def cell(src: str, dst: str) -> str:
        rate = rates.get((src, dst))
        if src == dst:
            return "-"
        if rate is None:
            return "n/a"
        return f"{rate * scale:.{2 if gbit else 1}f}" + ("*" if floor is not None and rate < floor else "")

    lines = _grid(f"bandwidth, {unit} (row sends to column; both directions at once, {report.seconds_per_test} s):",
                  nodes, cell)  # fmt: skip
    if floor is not None and median is not None:
        lines.append(f"(* below {report.thresholds.fraction:g} × the median {median * scale:.2f} {unit})")
    lines += render_rdma_matrix(report)
    for p in report.pairs:
        rtt = f"{p.rtt_ms:.3f} ms" if p.rtt_ms is not None else "n/a"
        loss = f"{p.loss_pct:g}%" if p.loss_pct is not None else "n/a"
        mtu = f"{p.path_mtu}/{p.mtu_expected}" if p.path_mtu else f"<{min(p.mtu_tried, default=0)}/{p.mtu_expected}"
        via = " (bandwidth: sparkfleet's stream test)" if p.tool == "stdlib" else ""
        link = f", link {p.link_mbps:g} Mbit/s" if p.link_mbps else ""
        rdma = ""
        if p.rdma_hcas is not None:
            lat = f", latency {p.rdma_lat_us:.2f} µs" if p.rdma_lat_us is not None else ""
            bw = f"{p.rdma_gbps:.2f} Gbit/s" if p.rdma_gbps is not None else "n/a"
            rdma = f"; RDMA {p.rdma_hcas[0]} → {p.rdma_hcas[1]} {bw}{lat}"
        lines.append(f"{p.a} {p.a_if or '?'} <-> {p.b} {p.b_if or '?'}: RTT {rtt}, loss {loss}, path MTU {mtu}"
                     f"{link}{via}{rdma}")  # fmt: skip
    return lines


def _grid(title: str, nodes: Sequence[str], cell: Callable[[str, str], str]) -> list[str]:
    """A title, then a matrix of nodes (row to column) with cell(row, column) in each place."""
    width = max(8, *(len(n) for n in nodes)) + 1
    lines = [title, " " * width + "".join(f"{n:>{width}}" for n in nodes)]
    for src in nodes:
        lines.append(f"{src:<{width}}" + "".join(f"{cell(src, dst):>{width}}" for dst in nodes))
    return lines


def render_rdma_matrix(report: FabricReport) -> list[str]:
    """ib_write_bw's matrix, Gbit/s, row writes to column (one direction per pair), when any pair
    was measured over RDMA."""
    measured = [p for p in report.pairs if p.rdma_hcas is not None]
    if not measured:
        return []
    nodes = report.nodes
    rates = {(p.a, p.b): p.rdma_gbps for p in measured}
    median = median_rdma_gbps(report.pairs)
    floor = median * report.thresholds.fraction if median else None

    def cell(src: str, dst: str) -> str:
        if src == dst:
            return "-"
        if (src, dst) not in rates:
            return ""
        rate = rates[(src, dst)]
        if rate is None:
            return "n/a"
        p = next(x for x in measured if (x.a, x.b) == (src, dst))
        low = (floor is not None and rate < floor) or (
            p.rdma_expected_gbps is not None and rate < report.thresholds.fraction * p.rdma_expected_gbps
        )
        return f"{rate:.2f}" + ("*" if low else "")

    lines = _grid("RDMA write bandwidth, Gbit/s (ib_write_bw, row writes to column):", nodes, cell)
    if median is not None:
        lines.append(f"(* below {report.thresholds.fraction:g} × the RDMA median {median:.2f} Gbit/s or × what the "
                     "HCAs can carry)")  # fmt: skip
    return lines


def run_fabric(
    targets: Sequence[NodeTarget],
    transports: Mapping[str, Transport],
    *,
    seconds: int = 2,
    thresholds: Thresholds = Thresholds(),
    port: int = IPERF3_PORT,
    timeout: float = 15.0,
    tool: str = "auto",
    rdma_port: int = PERFTEST_PORT,
) -> FabricReport:
    """Measure every pair over the nodes' fabric addresses, round by round, each round at once;
    bandwidth with iperf3 where both nodes have it (tool="auto"), else the shipped stream test;
    then, where both nodes have an ACTIVE HCA on their fabric address and perftest, ib_write_bw and
    ib_write_lat between those HCAs."""
    start = time.monotonic()
    by_name = {t.name: t for t in targets}
    names = [t.name for t in targets]

    def discover(n: str) -> tuple[LocalLink, RdmaEnd | None]:
        # One round trip: the link's facts, then the rdma fact's sysfs dump (their sections differ).
        out = transports[n].run(local_command(by_name[n].fabric_ip, rdma_probe.command()), timeout=timeout).stdout
        link = parse_local(out)
        try:
            facts: rdma_probe.RdmaFacts | None = rdma_probe.parse(out)
        except ValueError:
            facts = None  # an unreadable dump: no RDMA test, the TCP one still runs
        return link, rdma_end(facts, by_name[n].fabric_ip)

    local = fan_out(names, discover, workers=max(1, len(names)))
    links = {n: r[0] for n, r in local.succeeded.items()}
    ends = {n: r[1] for n, r in local.succeeded.items()}
    links.update({n: LocalLink(None, None, False, str(e)) for n, e in local.failures.items()})
    ends.update({n: None for n in local.failures})
    rounds = schedule(names)
    results: list[PairResult] = []
    Measured = tuple[PairMeasurement, RdmaMeasurement | None]
    for pairs in rounds:

        def one(key: str) -> Measured:
            a, b = key.split("\0")
            ea, eb = ends[a], ends[b]
            rdma = ea is not None and eb is not None and links[a].has_perftest and links[b].has_perftest
            # perftest's server only listens until its client comes: started now, it is up by the pair's turn.
            server = RdmaServer(transports[b], eb.hca, eb.gid_index, rdma_port) if rdma and eb else None
            try:
                m = measure_pair(transports[a], transports[b], by_name[a].fabric_ip, by_name[b].fabric_ip,
                                 seconds=seconds, mtu_sizes=mtu_ladder(links[a].mtu), port=port,
                                 tool=pair_tool(links[a], links[b], tool),
                                 pythons=(by_name[a].python, by_name[b].python))  # fmt: skip
            except BaseException:
                if server is not None:
                    server.close()
                raise
            if server is None or ea is None:
                return m, None
            return m, measure_rdma(transports[a], server, by_name[b].fabric_ip, src=(ea.hca, ea.gid_index),
                                   port=rdma_port)  # fmt: skip

        pairs = tuple((a, b) for a, b in pairs if links[a].error is None and links[b].error is None)
        keys = [f"{a}\0{b}" for a, b in pairs]
        group = fan_out(keys, one, workers=max(1, len(keys)))
        for (a, b), key in zip(pairs, keys, strict=True):
            outcome = group[key]
            m, rm = (
                outcome.value
                if outcome.ok and outcome.value
                else (PairMeasurement(None, None, (), (str(outcome.error),)), None)
            )
            ea, eb = ends[a], ends[b]
            rdma = (ea, eb, rm) if ea is not None and eb is not None and rm is not None else None
            results.append(pair_result(a, b, links[a], links[b], m, pair_tool(links[a], links[b], tool), rdma))
    checks = verdicts(results, links, thresholds, ends)
    return FabricReport(tuple(names), rounds, tuple(results), checks, time.monotonic() - start, seconds, thresholds)
