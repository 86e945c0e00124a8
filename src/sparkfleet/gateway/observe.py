"""What the gateway records of each request: the request log (SQLite rows, written in batches off
the event loop) and ``/metrics`` (prometheus_client, its own registry). Key *names* only: a key's
value never reaches either."""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import astuple, dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


@dataclass
class Row:
    """One request as the log keeps it."""

    time: float
    request_id: str
    key_name: str | None
    model: str | None
    deployment: str | None
    status: int
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft: float | None = None
    e2e: float | None = None
    finish_reason: str | None = None
    clamped: int = 0
    loop_aborted: int = 0
    error: str | None = None
    request_body: str | None = None
    response_text: str | None = None
    # Seconds a change made it wait: for a ready replica (a restart, a rollback, a switch one after
    # the other), or queued on a drained replica before it was sent to another.
    held: float | None = None


_COLUMNS = tuple(Row.__dataclass_fields__)
_INSERT = f"INSERT INTO requests ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"


class RequestLog:
    """Rows queue in memory and a thread writes them every ``interval`` seconds in one transaction
    (one commit per request would cost the event loop a write each); it also trims the table to
    ``keep_days`` and ``keep_rows``. Its connection is its own (the key lookups have another)."""

    def __init__(self, conn: sqlite3.Connection, keep_days: float, keep_rows: int, interval: float = 0.5) -> None:
        self.conn = conn
        self.keep_days = keep_days
        self.keep_rows = keep_rows
        self.interval = interval
        self._rows: list[Row] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-request-log", daemon=True)
        self._last_trim = 0.0

    def start(self) -> None:
        self._thread.start()

    def add(self, row: Row) -> None:
        with self._lock:
            self._rows.append(row)

    def flush(self) -> None:
        with self._lock:
            rows, self._rows = self._rows, []
        if rows:
            self.conn.execute("BEGIN")
            self.conn.executemany(_INSERT, [astuple(r) for r in rows])
            self.conn.execute("COMMIT")
        if time.time() - self._last_trim > 60:
            self._trim()

    def _trim(self) -> None:
        self._last_trim = time.time()
        if self.keep_days:
            self.conn.execute("DELETE FROM requests WHERE time < ?", (time.time() - self.keep_days * 86400,))
        if self.keep_rows:
            self.conn.execute("DELETE FROM requests WHERE id <= (SELECT MAX(id) FROM requests) - ?", (self.keep_rows,))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.flush()


class Metrics:
    """The gateway's Prometheus series."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("sparkfleet_gateway_requests", "Requests answered, by model, status and key name",
                                ["model", "status", "key"], registry=r)  # fmt: skip
        self.ttft = Histogram("sparkfleet_gateway_ttft_seconds", "Time to the first byte of the answer",
                              ["model"], buckets=_BUCKETS, registry=r)  # fmt: skip
        self.e2e = Histogram("sparkfleet_gateway_e2e_seconds", "Time to the end of the answer", ["model"],
                             buckets=_BUCKETS, registry=r)  # fmt: skip
        self.tokens = Counter("sparkfleet_gateway_tokens", "Tokens, by model and kind (prompt, completion)",
                              ["model", "kind"], registry=r)  # fmt: skip
        self.in_flight = Gauge("sparkfleet_gateway_in_flight", "Requests being answered now", ["model"], registry=r)
        self.clamped = Counter("sparkfleet_gateway_output_cap", "Requests whose max_tokens was filled or clamped",
                               ["model"], registry=r)  # fmt: skip
        self.loop_aborts = Counter("sparkfleet_gateway_loop_aborts", "Answers stopped by the loop detector",
                                   ["model"], registry=r)  # fmt: skip
        self.held = Gauge("sparkfleet_gateway_held", "Requests waiting now for a ready replica", ["model"],
                          registry=r)  # fmt: skip
        self.hold_outcomes = Counter("sparkfleet_gateway_hold", "Held requests by how their wait ended (released, "
                                     "full, timeout, dropped)", ["model", "outcome"], registry=r)  # fmt: skip
        self.replica_up = Gauge("sparkfleet_gateway_replica_up", "1 while a replica takes requests",
                                ["model", "replica"], registry=r)  # fmt: skip

    def scrape(self) -> bytes:
        return generate_latest(self.registry)
