"""The memory guard for real: this machine's /proc/meminfo over LocalTransport, a real HTTP abort."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from sparkfleet.evals.memguard import MemGuard, read_mem_available, sglang_abort
from sparkfleet.nodes.facts import parse_mem_available
from sparkfleet.nodes.transport.local import LocalTransport


class _AbortRecorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, dict[str, object]]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def abort_server() -> Iterator[tuple[str, list[tuple[str, dict[str, object]]]]]:
    _AbortRecorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AbortRecorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _AbortRecorder.seen
    server.shutdown()


def test_parse_meminfo() -> None:
    text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n"
    assert parse_mem_available(text) == 2048 * 1024
    with pytest.raises(ValueError):
        parse_mem_available("MemTotal: 1 kB\n")


def test_reads_this_machines_mem_available() -> None:
    value = read_mem_available(LocalTransport())
    meminfo = Path("/proc/meminfo").read_text()
    assert abs(value - parse_mem_available(meminfo)) < 512 * 1024**2


def test_a_floor_above_mem_available_trips_and_aborts(abort_server: tuple[str, list]) -> None:
    url, seen = abort_server
    nodes = [LocalTransport("node-a"), LocalTransport("node-b")]
    floor = read_mem_available(nodes[0]) + 64 * 1024**3
    with MemGuard(nodes, floor, [sglang_abort(url)], interval_s=0.2) as guard:
        assert guard.tripped.wait(5)
    report = guard.report()
    assert report.tripped and report.tripped_node == "node-a"
    assert seen == [("/abort_request", {"abort_all": True})]  # aborted once, not per sample
    assert set(report.low_water) == {"node-a", "node-b"}
    assert all(0 < low < floor for low in report.low_water.values())
    assert any("TRIPPED on node-a" in line for line in report.lines())
    assert "HTTP 200" in report.aborts[0]


def test_a_low_floor_only_reports_the_low_water_mark(abort_server: tuple[str, list]) -> None:
    url, seen = abort_server
    guard = MemGuard([LocalTransport()], 1, [sglang_abort(url)], interval_s=0.1).start()
    # Allocate and touch 512 MiB: the guard's low-water mark must reflect the dip it saw.
    block = bytearray(512 * 1024**2)
    for i in range(0, len(block), 4096):
        block[i] = 1
    guard.sample_once()
    during = read_mem_available(LocalTransport())
    report = guard.stop()
    del block
    assert not report.tripped and seen == []
    assert report.samples >= 2
    # Other processes move MemAvailable too, so allow slack around the reading taken with it.
    assert report.low_water["local"] <= during + 256 * 1024**2
