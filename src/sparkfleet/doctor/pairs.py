"""`doctor --fabric`: every pair of nodes measured over the fabric, in rounds, and judged.

A round-robin schedule (the circle method) puts every pair in exactly one round and no node in two
tests of one round: N−1 rounds for N nodes, N rounds with a bye each when N is odd. Each round's
pairs run at once (nodes/linktest.measure_pair); the verdicts are a pure function of the
measurements:

    fabric.bandwidth   each direction of each pair at ≥ fraction × the fleet's median (default 0.7)
    fabric.loss        ping loss ≤ max_loss_pct (default 1 %)
    fabric.path_mtu    a don't-fragment packet of the source interface's MTU is answered
    fabric.tool        iperf3 is installed on the node (without it, or with tool="stdlib", the pair's
                       bandwidth comes from the stream test shipped to the nodes: a warning)
    fabric.node        the node answered (SSH); a node that did not fails here, its pairs are skipped
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from sparkfleet.doctor.targets import Check, NodeTarget
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.linktest import (
    IPERF3_PORT,
    LocalLink,
    PairMeasurement,
    local_command,
    measure_pair,
    parse_local,
)
from sparkfleet.nodes.transport.base import Transport

IPERF3_FIX = "install iperf3 on the node (Debian/Ubuntu: apt-get install iperf3; scripts/setup-system.sh does)"


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


def pair_result(a: str, b: str, la: LocalLink, lb: LocalLink, m: PairMeasurement, tool: str | None = None
                ) -> PairResult:  # fmt: skip
    """A pair's figures from its measurement."""
    t, p = m.throughput, m.ping
    answered = [probe.size for probe in m.mtu if probe.passed]
    return PairResult(
        a=a, b=b, a_if=la.ifname, b_if=lb.ifname, mtu_expected=la.mtu,
        forward_mbps=t.forward_bps / 1e6 if t else None, reverse_mbps=t.reverse_bps / 1e6 if t else None,
        retransmits=(t.forward_retransmits, t.reverse_retransmits) if t else None,
        rtt_ms=p.rtt_avg_ms if p else None, loss_pct=p.loss_pct if p else None, pings=p.sent if p else None,
        path_mtu=max(answered) if answered else None, mtu_tried=tuple(probe.size for probe in m.mtu), errors=m.errors,
        tool=tool,
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


def verdicts(
    results: Sequence[PairResult], links: Mapping[str, LocalLink], th: Thresholds = Thresholds()
) -> tuple[Check, ...]:
    """Every pair's checks, and a fabric.tool check per node."""
    checks: list[Check] = []
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
    width = max(8, *(len(n) for n in nodes)) + 1
    lines = [f"bandwidth, {unit} (row sends to column; both directions at once, {report.seconds_per_test} s):",
             " " * width + "".join(f"{n:>{width}}" for n in nodes)]  # fmt: skip
    floor = median * report.thresholds.fraction if median else None
    for src in nodes:
        cells = []
        for dst in nodes:
            rate = rates.get((src, dst))
            if src == dst:
                cells.append(f"{'-':>{width}}")
            elif rate is None:
                cells.append(f"{'n/a':>{width}}")
            else:
                mark = "*" if floor is not None and rate < floor else ""
                cells.append(f"{f'{rate * scale:.{2 if gbit else 1}f}{mark}':>{width}}")
        lines.append(f"{src:<{width}}" + "".join(cells))
    if floor is not None and median is not None:
        lines.append(f"(* below {report.thresholds.fraction:g} × the median {median * scale:.2f} {unit})")
    for p in report.pairs:
        rtt = f"{p.rtt_ms:.3f} ms" if p.rtt_ms is not None else "n/a"
        loss = f"{p.loss_pct:g}%" if p.loss_pct is not None else "n/a"
        mtu = f"{p.path_mtu}/{p.mtu_expected}" if p.path_mtu else f"<{min(p.mtu_tried, default=0)}/{p.mtu_expected}"
        via = " (bandwidth: sparkfleet's stream test)" if p.tool == "stdlib" else ""
        lines.append(f"{p.a} {p.a_if or '?'} <-> {p.b} {p.b_if or '?'}: RTT {rtt}, loss {loss}, path MTU {mtu}{via}")
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
) -> FabricReport:
    """Measure every pair over the nodes' fabric addresses, round by round, each round at once;
    bandwidth with iperf3 where both nodes have it (tool="auto"), else the shipped stream test."""
    start = time.monotonic()
    by_name = {t.name: t for t in targets}
    names = [t.name for t in targets]
    local = fan_out(names, lambda n: transports[n].run(local_command(by_name[n].fabric_ip), timeout=timeout),
                    workers=max(1, len(names)))  # fmt: skip
    links = {n: parse_local(r.stdout) for n, r in local.succeeded.items()}
    links.update({n: LocalLink(None, None, False, str(e)) for n, e in local.failures.items()})
    rounds = schedule(names)
    results: list[PairResult] = []
    for pairs in rounds:

        def one(key: str) -> PairMeasurement:
            a, b = key.split("\0")
            return measure_pair(transports[a], transports[b], by_name[a].fabric_ip, by_name[b].fabric_ip,
                                seconds=seconds, mtu_sizes=mtu_ladder(links[a].mtu), port=port,
                                tool=pair_tool(links[a], links[b], tool),
                                pythons=(by_name[a].python, by_name[b].python))  # fmt: skip

        pairs = tuple((a, b) for a, b in pairs if links[a].error is None and links[b].error is None)
        keys = [f"{a}\0{b}" for a, b in pairs]
        group = fan_out(keys, one, workers=max(1, len(keys)))
        for (a, b), key in zip(pairs, keys, strict=True):
            outcome = group[key]
            m = (
                outcome.value
                if outcome.ok and outcome.value
                else PairMeasurement(None, None, (), (str(outcome.error),))
            )
            results.append(pair_result(a, b, links[a], links[b], m, pair_tool(links[a], links[b], tool)))
    checks = verdicts(results, links, thresholds)
    return FabricReport(tuple(names), rounds, tuple(results), checks, time.monotonic() - start, seconds, thresholds)
