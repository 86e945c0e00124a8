"""The time series ``watch`` records: one row per node and poll, bounded per deployment.

Each row: the node's MemAvailable, the poll's round trip to it, the ranks' states there; the
head node's row also carries rank 0's health and what the engine's ``/metrics`` said (running
and waiting requests, KV-cache usage, speculative acceptance). Only the newest ``limit`` rows
of a deployment are kept (the default: a 4-node deployment polled every 10 s for ~3 days).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkfleet.state.store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS watch_samples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    time REAL NOT NULL,
    node TEXT NOT NULL,
    mem_available INTEGER,
    poll_ms REAL,
    ranks TEXT,
    health TEXT,
    running REAL,
    waiting REAL,
    kv_usage REAL,
    spec_accept REAL
);
CREATE INDEX IF NOT EXISTS watch_samples_by_name ON watch_samples(name, id);
"""
MAX_SAMPLES = 100_000


@dataclass(frozen=True)
class Sample:
    """One node at one poll (the metrics fields only on the head node's row)."""

    time: float
    node: str
    mem_available: int | None
    poll_ms: float | None
    ranks: str  # "r0 running, r1 exited"
    health: str | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # fraction 0..1
    spec_accept: float | None = None  # tokens per decode step


class WatchSeries:
    """Append and read a deployment's samples."""

    def __init__(self, store: Store | None = None, limit: int = MAX_SAMPLES) -> None:
        self.store = store or Store()
        self.store.ensure(SCHEMA)
        self.limit = limit

    def add(self, name: str, samples: list[Sample]) -> None:
        """Append one poll's rows and drop the oldest beyond the bound."""
        with self.store.connect() as conn:
            conn.executemany(
                "INSERT INTO watch_samples (name, time, node, mem_available, poll_ms, ranks, health, running, waiting,"
                " kv_usage, spec_accept) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(name, s.time, s.node, s.mem_available, s.poll_ms, s.ranks, s.health, s.running, s.waiting,
                  s.kv_usage, s.spec_accept) for s in samples],
            )  # fmt: skip
            conn.execute(
                "DELETE FROM watch_samples WHERE name = ? AND id <= (SELECT id FROM watch_samples WHERE name = ?"
                " ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (name, name, self.limit),
            )

    def samples(self, name: str, limit: int | None = None) -> list[dict[str, Any]]:
        """The newest rows of name (all kept ones by default), oldest first."""
        with self.store.connect(write=False) as conn:
            rows = conn.execute("SELECT * FROM watch_samples WHERE name = ? ORDER BY id DESC LIMIT ?",
                                (name, limit or self.limit)).fetchall()  # fmt: skip
        return [dict(r) for r in reversed(rows)]

    def names(self) -> list[str]:
        """Deployments with samples."""
        with self.store.connect(write=False) as conn:
            return [r["name"] for r in conn.execute("SELECT DISTINCT name FROM watch_samples ORDER BY name")]
