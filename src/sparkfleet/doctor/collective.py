"""`doctor --fabric --nccl RECIPE`: the collective the engine will run, measured on the plan's ranks.

Every rank runs nodes/shipped/collective_sweep.py at once, with its engine's interpreter (or image)
and its planned environment (NCCL_* from cluster and recipe, NCCL_DEBUG=INFO added): all-reduce and
all-gather over message sizes from 1 KiB up, as nccl-tests measures them. Read here, purely: rank 0's
rows (time, algorithm and bus bandwidth per size), each rank's backend and device, and the transport
NCCL chose from its INFO lines (``Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA``, the
format of NCCL's transport/net.cc, p2p.cc and shm.cc). The bus bandwidth at the largest size is set
beside the slowest fabric pair among the ranks' nodes (the pair test of the same run, or the last
stored one), the figure the collective cannot beat.

    fabric.collective   every rank finished the sweep (a rank that failed names its error)
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from sparkfleet.doctor.targets import Check
from sparkfleet.nodes.collective import SweepRank, rank_python, run_sweep_rank
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.transport.base import Result, Transport
from sparkfleet.plan.model import Plan

DEFAULT_PORT = 29511
MIN_BYTES = 1 << 10
_VIA = re.compile(r"NCCL INFO Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\](?: \[(?:send|receive)\])? via (\S+)")
_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")


def sweep_sizes(max_bytes: int) -> tuple[int, ...]:
    """1 KiB, then ×4 up to max_bytes (which is always the last size)."""
    sizes, size = [], MIN_BYTES
    while size < max_bytes:
        sizes.append(size)
        size *= 4
    return (*sizes, max(max_bytes, MIN_BYTES))


@dataclass(frozen=True)
class SweepRow:
    op: str  # "all_reduce" | "all_gather"
    bytes: int
    iters: int
    time_us: float
    algbw_gbps: float  # GB/s, as nccl-tests prints it
    busbw_gbps: float


@dataclass(frozen=True)
class RankOutcome:
    rank: int
    node: str
    backend: str | None
    device: str | None
    error: str | None


def transport_name(via: str) -> str:
    """NCCL's `via` word without what differs per channel: NET/IB/0/GDRDMA → NET/IB/GDRDMA,
    P2P/CUMEM/read → P2P/CUMEM, SHM/direct/direct → SHM/direct."""
    parts = via.split("/")
    if parts[0] == "NET" and len(parts) > 1:
        return "/".join(["NET", parts[1], *(p for p in parts[3:] if p and not p[0].isdigit())])
    return "/".join(parts[:2])


def parse_nccl(text: str) -> tuple[str | None, Counter[str]]:
    """NCCL's INFO lines: the network it used and how many channel connections went over each transport."""
    network = None
    for m in _NETWORK.finditer(text):
        network = m.group(1)
    return network, Counter(transport_name(m.group(1)) for m in _VIA.finditer(text))


def parse_rank(stdout: str) -> tuple[dict[str, object], list[SweepRow], str | None]:
    """One rank's output: its header (rank, backend, device), rank 0's rows, its error or None."""
    header: dict[str, object] = {}
    rows: list[SweepRow] = []
    error = None
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue  # NCCL and torch print their own lines on stdout too
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if "error" in obj:
            error = one_line(str(obj["error"]))
        elif "op" in obj:
            rows.append(SweepRow(**{k: obj[k] for k in SweepRow.__dataclass_fields__}))
        elif "backend" in obj:
            header = obj
    return header, rows, error


@dataclass(frozen=True)
class CollectiveReport:
    ranks: tuple[RankOutcome, ...]
    rows: tuple[SweepRow, ...]
    network: str | None
    transports: tuple[tuple[str, int], ...]  # (transport, channel connections), most used first
    link_gbits: float | None  # the slowest fabric pair among the ranks' nodes, Gbit/s
    link_from: str | None  # where that figure comes from
    checks: tuple[Check, ...]
    seconds: float

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == "fail")

    def peak(self, op: str = "all_reduce") -> SweepRow | None:
        """The op's row at the largest size."""
        rows = [r for r in self.rows if r.op == op]
        return max(rows, key=lambda r: r.bytes) if rows else None

    def to_json(self) -> dict[str, object]:
        return {
            "ok": not self.failed,
            "seconds": round(self.seconds, 3),
            "ranks": [asdict(r) for r in self.ranks],
            "rows": [asdict(r) for r in self.rows],
            "network": self.network,
            "transports": [list(t) for t in self.transports],
            "link_gbits": self.link_gbits,
            "link_from": self.link_from,
            "checks": [asdict(c) for c in self.checks],
        }


def slowest_link(report: Mapping[str, object] | None, nodes: Sequence[str]) -> float | None:
    """The slowest direction (Gbit/s) of a `doctor --fabric` report's pairs among nodes."""
    if not report:
        return None
    rates = []
    for p in report.get("pairs") or ():  # type: ignore[attr-defined]
        if p["a"] in nodes and p["b"] in nodes:
            rates += [r for r in (p.get("forward_mbps"), p.get("reverse_mbps")) if r is not None]
    return min(rates) / 1000 if rates else None


def judge(ranks: Sequence[RankOutcome], rows: Sequence[SweepRow]) -> tuple[Check, ...]:
    failed = [r for r in ranks if r.error]
    if failed:
        return tuple(Check("fabric.collective", r.node, "fail", f"rank {r.rank}: {r.error}",
                           "run the sweep's Python on that node by hand; --nccl-python names another")
                     for r in failed)  # fmt: skip
    peak = max((r for r in rows if r.op == "all_reduce"), key=lambda r: r.bytes, default=None)
    if peak is None:
        return (Check("fabric.collective", "fleet", "fail", "rank 0 printed no result"),)
    backend = {r.backend for r in ranks}
    return (Check("fabric.collective", "fleet", "pass", f"{len(ranks)} ranks ({'/'.join(sorted(map(str, backend)))}): "
                  f"all-reduce bus bandwidth {peak.busbw_gbps:.3g} GB/s at {human_bytes(peak.bytes)}"),)  # fmt: skip


def sweep_ranks(planned: Plan, python: str | None = None) -> tuple[SweepRank, ...]:
    """The plan's ranks as the sweep runs them: each with its engine's interpreter (or image) and
    its planned environment, secrets left out, NCCL_DEBUG=INFO unless the plan sets it."""
    out = []
    for r in sorted(planned.ranks, key=lambda r: r.rank):
        env = {e.key: e.value for e in r.env if not e.secret}
        env.setdefault("NCCL_DEBUG", "INFO")
        chosen = python or ("python3" if r.runtime == "docker" else rank_python(r.argv, r.node.python))
        out.append(SweepRank(r.rank, r.node, r.runtime, chosen, r.image, tuple(env.items())))
    return tuple(out)


def run_collective(
    ranks: Sequence[SweepRank],
    transports: Mapping[str, Transport],
    *,
    max_bytes: int,
    port: int = DEFAULT_PORT,
    backend: str = "auto",
    timeout: float = 300.0,
    fabric_report: Mapping[str, object] | None = None,
    link_from: str | None = None,
) -> CollectiveReport:
    """Run the sweep on every rank at once and read it."""
    start = time.monotonic()
    master = ranks[0].node.fabric_ip
    sizes = list(sweep_sizes(max_bytes))

    def one(key: str) -> Result:
        r = ranks[int(key)]
        args = {"rank": r.rank, "world": len(ranks), "master": master, "port": port, "sizes": sizes,
                "backend": backend, "timeout_s": max(10.0, timeout - 10)}  # fmt: skip
        return run_sweep_rank(transports[r.node.name], r, args, timeout)

    group = fan_out([str(i) for i in range(len(ranks))], one, workers=max(1, len(ranks)))
    outcomes, rows, nccl_text = [], [], ""
    for i, r in enumerate(ranks):
        got = group[str(i)]
        if not got.ok or got.value is None:
            outcomes.append(RankOutcome(r.rank, r.node.name, None, None, str(got.error)))
            continue
        result = got.value
        header, mine, error = parse_rank(result.stdout)
        if error is None and not result.ok:
            error = f"exit {result.exit_code}: {result.tail(3) or 'no output'}"
        backend_used, device = _str(header.get("backend")), _str(header.get("device"))
        outcomes.append(RankOutcome(r.rank, r.node.name, backend_used, device, error))
        rows += mine
        nccl_text += result.stdout + "\n" + result.stderr
    network, used = parse_nccl(nccl_text)
    names = [r.node.name for r in ranks]
    return CollectiveReport(tuple(outcomes), tuple(rows), network, tuple(used.most_common()),
                            slowest_link(fabric_report, names), link_from, judge(outcomes, rows),
                            time.monotonic() - start)  # fmt: skip


def one_line(error: str) -> str:
    """An error as one line: NCCL's own reason when torch wraps it ("... Last error:\nReason")."""
    _, found, last = error.rpartition("Last error:")
    if found and last.strip():
        return f"NCCL: {' '.join(last.split())}"
    return " / ".join(line.strip() for line in error.splitlines() if line.strip())


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def render_collective(report: CollectiveReport) -> list[str]:
    """The sweep as nccl-tests prints it (per size: time, algbw, busbw of each op), then what NCCL
    chose and how the peak compares with the link."""
    backends = sorted({f"{r.backend} on {r.device}" for r in report.ranks if r.backend})
    lines = [f"collective sweep: {len(report.ranks)} ranks ({', '.join(backends) or 'no backend'}); "
             "time in µs, bandwidth in GB/s (bus = what each link carries)",
             f"{'size':>9} {'all_reduce':>10} {'algbw':>8} {'busbw':>8} {'all_gather':>11} {'algbw':>8} "
             f"{'busbw':>8}"]  # fmt: skip
    by = {(r.op, r.bytes): r for r in report.rows}
    for size in sorted({r.bytes for r in report.rows}):
        cells = [f"{human_bytes(size):>9}"]
        for op, width in (("all_reduce", 10), ("all_gather", 11)):
            row = by.get((op, size))
            cells += ([f"{row.time_us:>{width}.1f}", f"{row.algbw_gbps:>8.3f}", f"{row.busbw_gbps:>8.3f}"] if row
                      else [f"{'n/a':>{width}}", f"{'':>8}", f"{'':>8}"])  # fmt: skip
        lines.append(" ".join(cells))
    if report.transports:
        used = ", ".join(f"{name} ({n} channel connections)" for name, n in report.transports)
        lines.append(f"NCCL transport: {used}" + (f"; network {report.network}" if report.network else ""))
    elif any(r.backend == "nccl" for r in report.ranks):
        lines.append("NCCL transport: not in NCCL's output (NCCL_DEBUG=INFO printed no channel lines)")
    peak = report.peak()
    if peak is not None and report.link_gbits:
        bus = peak.busbw_gbps * 8
        lines.append(f"all-reduce at {human_bytes(peak.bytes)}: bus {bus:.3g} Gbit/s = {bus / report.link_gbits:.2f} × "
                     f"the slowest fabric pair's {report.link_gbits:.3g} Gbit/s ({report.link_from})")  # fmt: skip
    return lines
