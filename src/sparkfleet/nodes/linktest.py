"""Measuring one pair of nodes over the fabric: the node-side commands and their pure parsers
(each tested on captured real output, tests/fixtures/fabric/).

The target runs a one-test `iperf3 -s -1` under `timeout`; the source runs `iperf3 --bidir`,
`ping` and don't-fragment pings from the interface MTU down. RDMA pairs use perftest's
`ib_write_bw` / `ib_write_lat`.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from sparkfleet.errors import TransportError
from sparkfleet.nodes.ship import LINK_STREAM, shipped_argv
from sparkfleet.nodes.transport.base import Stream, Transport

IPERF3_PORT = 5201
PING_COUNT = 50


# -- what a node has ------------------------------------------------------------------------
_LOCAL_SCRIPT = (
    "ifname=$(ip -o -4 addr show to \"$1/32\" | awk '{print $2; exit}'); "
    'echo "## if $ifname"; [ -n "$ifname" ] && ip -o link show dev "$ifname"; '
    'echo "## iperf3"; command -v iperf3; '
    'echo "## speed"; [ -n "$ifname" ] && cat "/sys/class/net/$ifname/speed" 2>/dev/null; '
    'echo "## qdisc"; [ -n "$ifname" ] && tc qdisc show dev "$ifname" 2>/dev/null; '
    'echo "## perftest"; command -v ib_write_bw; command -v ib_write_lat; true'
)


def local_command(fabric_ip: str, then: Sequence[str] = ()) -> list[str]:
    """The argv that names the interface holding fabric_ip, its link line, iperf3's path, the
    interface's reported speed (sysfs), its root qdisc (a shaped rate) and perftest's paths; then
    the argv `then` (another fact's command, in the same round trip), if given."""
    return ["sh", "-c", _LOCAL_SCRIPT + '; shift; [ "$#" -gt 0 ] && "$@"; true', "linktest", fabric_ip, *then]


@dataclass(frozen=True)
class LocalLink:
    """The interface that holds a node's fabric address (None: no interface holds it)."""

    ifname: str | None
    mtu: int | None
    has_iperf3: bool
    error: str | None = None  # the node did not answer: why
    speed_mbps: int | None = None  # /sys/class/net/IF/speed (None: -1 or unreadable, as on many virtual NICs)
    shaped_mbps: float | None = None  # the rate of a token bucket (tbf) at the interface's root, if any
    has_perftest: bool = False  # ib_write_bw and ib_write_lat both on PATH

    @property
    def link_mbps(self) -> float | None:
        """What the interface can send: its reported speed, or the rate it is shaped to if lower."""
        known = [x for x in (self.speed_mbps, self.shaped_mbps) if x]
        return min(known) if known else None


_UNITS = {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3, "T": 1e6}


def parse_tc_rate(line: str) -> float | None:
    """The rate of a root tbf qdisc line of `tc qdisc show` ("qdisc tbf 8001: root … rate 200Mbit …") in Mbit/s."""
    if " root " not in f" {line} " or not line.startswith("qdisc tbf"):
        return None
    m = re.search(r"\brate ([\d.]+)([KMGT]?)bit\b", line)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def parse_local(text: str) -> LocalLink:
    ifname, mtu, iperf3, speed, shaped, perftest = None, None, False, None, None, 0
    section = ""
    for line in text.splitlines():
        if line.startswith("## if"):
            ifname, section = (line[len("## if") :].strip() or None), "if"
        elif line.startswith("## "):
            section = line[3:].strip()
        elif section == "if" and (m := re.search(r"\bmtu (\d+)", line)):
            mtu = int(m.group(1))
        elif section == "iperf3" and line.strip():
            iperf3 = True
        elif section == "speed" and re.fullmatch(r"\d+", line.strip()):
            speed = int(line.strip()) or None
        elif section == "qdisc" and (rate := parse_tc_rate(line.strip())) is not None:
            shaped = rate
        elif section == "perftest" and line.strip():
            perftest += 1
    return LocalLink(ifname, mtu, iperf3, None, speed, shaped, perftest >= 2)


# -- iperf3 ---------------------------------------------------------------------------------
_SERVER_SCRIPT = (
    'timeout -k 1 "$1" iperf3 -s -1 --forceflush -B "$2" -p "$3" & pid=$!; '
    'cat >/dev/null; kill "$pid" 2>/dev/null; wait "$pid"'
)


def server_command(bind_ip: str, port: int, limit_s: float) -> list[str]:
    """iperf3's server for one test on bind_ip:port (`-1`: it exits after that test), stopped when
    the controller closes its stdin, and by `timeout` at limit_s whatever happens
    (`--forceflush`: its "Server listening" line arrives at once, not when it exits)."""
    return ["sh", "-c", _SERVER_SCRIPT, "iperf3-server", f"{limit_s:g}", bind_ip, str(port)]


READY = "Server listening"


@dataclass(frozen=True)
class Throughput:
    """One bidirectional iperf3 test: bits/s received at each end, TCP retransmits of each sender."""

    forward_bps: float  # client → server
    reverse_bps: float  # server → client
    forward_retransmits: int
    reverse_retransmits: int


def parse_iperf3(text: str) -> Throughput:
    """Parse `iperf3 -c … --bidir --json` (ValueError with iperf3's own error when it failed)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"iperf3 printed no JSON: {text.strip()[:200] or 'nothing'}") from exc
    if data.get("error"):
        raise ValueError(f"iperf3: {data['error']}")
    end = data.get("end", {})
    try:
        return Throughput(
            forward_bps=float(end["sum_received"]["bits_per_second"]),
            reverse_bps=float(end["sum_received_bidir_reverse"]["bits_per_second"]),
            forward_retransmits=int(end["sum_sent"].get("retransmits", 0)),
            reverse_retransmits=int(end["sum_sent_bidir_reverse"].get("retransmits", 0)),
        )
    except KeyError as exc:
        raise ValueError(f"iperf3's JSON has no end.{exc.args[0]} (a test without --bidir?)") from None


# -- ping -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PingStats:
    """ping's summary: packets sent and answered, loss in percent, mean RTT in ms (None: no reply)."""

    sent: int
    received: int
    loss_pct: float
    rtt_avg_ms: float | None = None


_PING_COUNTS = re.compile(
    r"(\d+) packets transmitted, (\d+) (?:packets )?received(?:, \+\d+ errors)?, ([\d.]+)% packet loss"
)
_PING_RTT = re.compile(r"= [\d.]+/([\d.]+)/[\d.]+/[\d.]+ ms")  # min/avg/max/mdev


def parse_ping(text: str) -> PingStats:
    """Parse iputils ping's summary lines (ValueError when there are none)."""
    counts = _PING_COUNTS.search(text)
    if not counts:
        raise ValueError(f"no ping statistics in: {text.strip()[:200] or 'nothing'}")
    rtt = _PING_RTT.search(text)
    return PingStats(int(counts.group(1)), int(counts.group(2)), float(counts.group(3)), float(rtt[1]) if rtt else None)


@dataclass(frozen=True)
class MtuProbe:
    """One don't-fragment ping of `size` bytes (IP packet): answered or not."""

    size: int
    passed: bool


def parse_mtu_probe(size: int, text: str) -> MtuProbe:
    """Parse `ping -M do -s SIZE-28 -c 1` output (not passed, too, when the sender refused it itself:
    "message too long", with no statistics)."""
    try:
        passed = parse_ping(text).received > 0
    except ValueError:
        passed = False
    return MtuProbe(size, passed)


# -- the source's script ----------------------------------------------------------------------
_CLIENT_SCRIPT = (
    "dst=$1 src=$2 port=$3 secs=$4 count=$5; shift 5; "
    'if [ "$secs" != 0 ]; then echo "## iperf3"; '
    'timeout $((secs + 5)) iperf3 -c "$dst" -B "$src" -p "$port" -t "$secs" --bidir --json --connect-timeout 2000; fi; '
    'echo "## ping"; ping -c "$count" -i 0.01 -W 1 -q -I "$src" "$dst" 2>&1; '
    'for size in "$@"; do echo "## mtu $size"; '
    'ping -M do -s $((size - 28)) -c 1 -W 1 -I "$src" "$dst" 2>&1 && break; done; true'
)


def client_command(dst_ip: str, src_ip: str, *, port: int, seconds: int, mtu_sizes: Sequence[int]) -> list[str]:
    """The source's script: iperf3 (skipped with seconds=0), ping, then don't-fragment pings of
    each size in turn until one is answered."""
    return ["sh", "-c", _CLIENT_SCRIPT, "linktest", dst_ip, src_ip, str(port), str(seconds), str(PING_COUNT),
            *(str(s) for s in mtu_sizes)]  # fmt: skip


@dataclass(frozen=True)
class PairMeasurement:
    """What one pair test saw, from the source's side; `errors` says what could not be measured."""

    throughput: Throughput | None
    ping: PingStats | None
    mtu: tuple[MtuProbe, ...]
    errors: tuple[str, ...] = ()


def parse_client(text: str) -> PairMeasurement:
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            sections.append((line[3:].strip(), []))
        elif sections:
            sections[-1][1].append(line)
    throughput, ping, probes, errors = None, None, [], []
    for name, lines in sections:
        body = "\n".join(lines)
        try:
            if name == "iperf3":
                throughput = parse_iperf3(body)
            elif name == "ping":
                ping = parse_ping(body)
            elif name.startswith("mtu "):
                probes.append(parse_mtu_probe(int(name.split()[1]), body))
        except ValueError as exc:
            errors.append(str(exc))
    return PairMeasurement(throughput, ping, tuple(probes), tuple(errors))


# -- the stream test shipped where iperf3 is missing (nodes/shipped/link_stream.py) ------------
def parse_stream_end(text: str) -> tuple[int, float]:
    """One end's `{"received": bytes, "seconds": s}` line (ValueError when it printed none)."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            if "received" in data:
                return int(data["received"]), float(data["seconds"])
    raise ValueError(f"the stream test printed no result: {text.strip()[:200] or 'nothing'}")


def stream_throughput(server_text: str, client_text: str) -> Throughput:
    """Both ends' counts as a Throughput (bits/s received at each end; retransmits unknown: 0)."""
    (fwd, fwd_s), (rev, rev_s) = parse_stream_end(server_text), parse_stream_end(client_text)
    if fwd_s <= 0 or rev_s <= 0:
        raise ValueError("the stream test moved no data in one direction")
    return Throughput(fwd * 8 / fwd_s, rev * 8 / rev_s, 0, 0)


def _end(server: Stream) -> None:
    """Stop a test's server: closing its stdin makes its wrapper stop it (if the test has not
    already), then a short wait for it to go before it is killed."""
    server.close_stdin()
    with contextlib.suppress(TransportError):
        server.wait(timeout=3)
    server.close()


def _stream_pair(source: Transport, target: Transport, src_ip: str, dst_ip: str, port: int, seconds: int,
                 limit: float, pythons: tuple[str, str]) -> tuple[Throughput | None, str | None]:  # fmt: skip
    server = target.stream(shipped_argv(pythons[1], LINK_STREAM, ["serve", dst_ip, str(port), str(seconds),
                                                                  f"{limit:g}"]), stdin=True)  # fmt: skip
    try:
        lines = iter(server)
        for line in lines:
            if line.startswith("listening"):
                break
        else:
            return None, f"stream test server on {dst_ip}:{port} did not start: {server.errors() or 'no output'}"
        client = source.run(shipped_argv(pythons[0], LINK_STREAM, ["connect", dst_ip, src_ip, str(port), str(seconds)]),
                            timeout=limit + 5, check=False)  # fmt: skip
        rest = "".join(lines)
        try:
            return stream_throughput(rest, client.stdout), None
        except ValueError as exc:
            return None, f"stream test: {exc} {client.stderr.strip()[:200]}".strip()
    finally:
        _end(server)


def measure_pair(
    source: Transport,
    target: Transport,
    src_ip: str,
    dst_ip: str,
    *,
    seconds: int,
    mtu_sizes: Sequence[int],
    port: int = IPERF3_PORT,
    tool: str = "iperf3",
    pythons: tuple[str, str] = ("python3", "python3"),
) -> PairMeasurement:
    """Run one pair test: the server on the target (a one-test `iperf3 -1` under `timeout`, or with
    tool="stdlib" the shipped stream test run by the nodes' pythons: source, target), the script
    on the source. The server is gone when this returns or, at the latest, at its time limit."""
    limit = seconds + 8

    def client(secs: int, throughput: Throughput | None = None, error: str | None = None) -> PairMeasurement:
        argv = client_command(dst_ip, src_ip, port=port, seconds=secs, mtu_sizes=mtu_sizes)
        got = parse_client(source.run(argv, timeout=limit + 5, check=False).stdout)
        errors = (error, *got.errors) if error else got.errors
        return PairMeasurement(throughput or got.throughput, got.ping, got.mtu, errors)

    if tool == "stdlib":
        return client(0, *_stream_pair(source, target, src_ip, dst_ip, port, seconds, limit, pythons))
    server = target.stream(server_command(dst_ip, port, limit), stdin=True)
    try:
        seen = []
        for line in server:
            seen.append(line)
            if READY in line:
                return client(seconds)
        said = " ".join(x.strip() for x in seen if x.strip() and not x.startswith("---"))
        return client(0, None, f"iperf3 server on {dst_ip}:{port} did not start: {said or 'no output'}")
    finally:
        _end(server)


# -- RDMA (perftest) ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RdmaBandwidth:
    """`ib_write_bw --report_gbits`'s result line, rates in Gbit/s."""

    peak_gbps: float
    average_gbps: float


@dataclass(frozen=True)
class RdmaLatency:
    """`ib_write_lat`'s result line, in microseconds."""

    typical_us: float
    p99_us: float


def _result_rows(text: str, header_word: str) -> tuple[str, list[float]]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#bytes") and header_word in line:
            for row in lines[i + 1 :]:
                fields = row.split()
                if fields and all(re.fullmatch(r"[\d.]+", f) for f in fields):
                    return line, [float(f) for f in fields]
            break
    raise ValueError(f"no {header_word} result line in perftest output")


def parse_ib_write_bw(text: str) -> RdmaBandwidth:
    """Parse `ib_write_bw --report_gbits` (its rates in Gb/sec; ValueError for any other unit)."""
    header, row = _result_rows(text, "BW average")
    if "BW average[Gb/sec]" not in header or len(row) < 5:
        raise ValueError(f"not an ib_write_bw --report_gbits result line: {header.strip()}")
    return RdmaBandwidth(peak_gbps=row[2], average_gbps=row[3])  # after #bytes and #iterations


def parse_ib_write_lat(text: str) -> RdmaLatency:
    _, row = _result_rows(text, "t_avg")
    if len(row) < 9:
        raise ValueError("ib_write_lat result line has fewer than 9 fields")
    # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
    return RdmaLatency(typical_us=row[4], p99_us=row[7])


# -- running perftest between two HCAs ----------------------------------------------------------
PERFTEST_PORT = 18515  # perftest's own default (its TCP port for exchanging QP details): ib_write_bw; +1 ib_write_lat
RDMA_READY = "Waiting for client to connect"
RDMA_QPS = 4  # queue pairs of ib_write_bw: one QP stays below line rate on a 200G port
RDMA_BW_ITERS = 5000  # per QP, perftest's default (the captured output's 20000 = 4 × 5000): ~0.1 s at 100 Gbit/s
RDMA_LAT_ITERS = 1000
RDMA_LIMIT_S = 10.0  # each tool's time limit: a link at a hundredth of its rate still finishes
LAT_SECTION = "## ib_write_lat"
SERVER_END = "## perftest servers ended"


def perftest_argv(tool: str, hca: str, gid_index: int, port: int) -> list[str]:
    """One end of a perftest run: `-d` the HCA, `-x` its RoCE v2 GID index, `-F` (no cpufreq
    warning), `-p` its port; ib_write_bw over RDMA_QPS QPs of RDMA_BW_ITERS 64 KiB writes each,
    ib_write_lat for RDMA_LAT_ITERS round trips."""
    argv = [tool, "-d", hca, "-x", str(gid_index), "-F", "-p", str(port)]
    if tool == "ib_write_bw":
        return [*argv, "--report_gbits", "-q", str(RDMA_QPS), "-n", str(RDMA_BW_ITERS)]
    return [*argv, "-n", str(RDMA_LAT_ITERS)]  # its --help lists no --report_gbits, and it refuses -q


def perftest_server_command(hca: str, gid_index: int, port: int) -> list[str]:
    """perftest's servers on one HCA, both listening at once: ib_write_bw on `port`, ib_write_lat
    on `port + 1` (each serves one test and exits), each under `timeout` at RDMA_LIMIT_S and
    line-buffered (their "Waiting for client" lines arrive at once); SERVER_END when both have
    ended; both stopped when the controller closes stdin."""
    bw = shlex.join(perftest_argv("ib_write_bw", hca, gid_index, port))
    lat = shlex.join(perftest_argv("ib_write_lat", hca, gid_index, port + 1))
    run = f"timeout -k 1 {RDMA_LIMIT_S:g} stdbuf -oL"
    script = (
        "( trap 'kill $b $l 2>/dev/null; exit 143' TERM; "
        f"{run} {lat} 2>&1 & l=$!; {run} {bw} 2>&1 & b=$!; wait $b; wait $l; "
        f"echo '{SERVER_END}' ) & pid=$!; "
        'cat >/dev/null; kill "$pid" 2>/dev/null; wait "$pid"'
    )
    return ["sh", "-c", script]


def perftest_client_command(hca: str, gid_index: int, port: int, server_ip: str) -> list[str]:
    """perftest's clients against server_ip: ib_write_bw on `port`, then (when it succeeded)
    ib_write_lat on `port + 1`, each under `timeout` at RDMA_LIMIT_S."""
    bw = shlex.join([*perftest_argv("ib_write_bw", hca, gid_index, port), server_ip])
    lat = shlex.join([*perftest_argv("ib_write_lat", hca, gid_index, port + 1), server_ip])
    run = f"timeout -k 1 {RDMA_LIMIT_S:g}"
    return ["sh", "-c", f"{run} {bw} 2>&1 || exit 0; echo '{LAT_SECTION}'; {run} {lat} 2>&1; true"]


@dataclass(frozen=True)
class RdmaMeasurement:
    """One HCA pair: ib_write_bw (source writes to target) and ib_write_lat; `errors`: what failed."""

    bandwidth: RdmaBandwidth | None
    latency: RdmaLatency | None
    errors: tuple[str, ...] = ()


def parse_perftest_client(text: str) -> RdmaMeasurement:
    bw_text, _, lat_text = text.partition(LAT_SECTION)
    bw = lat = None
    errors = []
    for tool, part in (("ib_write_bw", bw_text), ("ib_write_lat", lat_text)):
        if tool == "ib_write_lat" and LAT_SECTION not in text:
            break  # not run: ib_write_bw's error says why
        try:
            if tool == "ib_write_bw":
                bw = parse_ib_write_bw(part)
            else:
                lat = parse_ib_write_lat(part)
        except ValueError:
            said = " ".join(x.strip() for x in part.splitlines() if x.strip() and not x.startswith("-"))
            errors.append(f"{tool}: {said[-300:] or 'no output'}")
    return RdmaMeasurement(bw, lat, tuple(errors))


class RdmaServer:
    """perftest's servers on the target's HCA, started ahead of the pair's turn (they only listen
    until a client comes); `close` stops them, whatever state they are in."""

    def __init__(self, target: Transport, hca: str, gid_index: int, port: int = PERFTEST_PORT) -> None:
        self.hca = hca
        self._stream = target.stream(perftest_server_command(hca, gid_index, port), stdin=True)
        self._seen: list[str] = []

    def ready(self) -> str | None:
        """Wait for both servers to listen: None, or why they did not."""
        waiting = 2
        for line in self._stream:
            self._seen.append(line)
            waiting -= RDMA_READY in line
            if not waiting:
                return None
            if SERVER_END in line:
                break
        said = " ".join(x.strip() for x in self._seen if x.strip() and not x.startswith(("-", "##")))
        return f"perftest servers on {self.hca} did not start: {said[-300:] or 'no output'}"

    def close(self) -> None:
        _end(self._stream)


def measure_rdma(source: Transport, server: RdmaServer, dst_ip: str, *, src: tuple[str, int],
                 port: int = PERFTEST_PORT) -> RdmaMeasurement:  # fmt: skip
    """ib_write_bw, then ib_write_lat, from the source's HCA (name, GID index) to the server's,
    connecting to the target's fabric address; the server is closed when this returns."""
    try:
        why = server.ready()
        if why is not None:
            return RdmaMeasurement(None, None, (why,))
        argv = perftest_client_command(src[0], src[1], port, dst_ip)
        out = source.run(argv, timeout=2 * RDMA_LIMIT_S + 10, check=False)
        return parse_perftest_client(out.stdout)
    finally:
        server.close()
