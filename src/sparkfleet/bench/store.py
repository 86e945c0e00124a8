"""Benchmark history in the state store: one row per run, one per measured tier repeat.

A run is written when it starts (status ``running``), each measured tier repeat as soon as it
ends, and the status is set to ``complete`` at the end or ``partial`` when it was interrupted or
failed part way — so Ctrl-C never loses what was measured, and ``bench show`` says what it is.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from sparkfleet.bench.client import RequestRecord
from sparkfleet.errors import BenchError
from sparkfleet.state.store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS bench_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,               -- decode | prefill
    status TEXT NOT NULL,             -- running | complete | partial
    created_at TEXT NOT NULL,
    finished_at TEXT,
    label TEXT,
    endpoint TEXT NOT NULL,
    model TEXT,
    engine TEXT,
    engine_version TEXT,
    deployment TEXT,
    meta TEXT NOT NULL,               -- JSON: config, recipe, nodes, parallelism, flags, revision
    note TEXT
);
CREATE TABLE IF NOT EXISTS bench_samples (
    run_id INTEGER NOT NULL REFERENCES bench_runs(id) ON DELETE CASCADE,
    tier TEXT NOT NULL,               -- "prose/c4" (decode) or "16384" (prefill)
    repeat INTEGER NOT NULL,
    metrics TEXT NOT NULL,            -- JSON of the run's figures
    requests TEXT NOT NULL,           -- JSON list of the raw request records
    PRIMARY KEY (run_id, tier, repeat)
);
"""


@dataclass(frozen=True)
class StoredRun:
    """A run's row."""

    id: int
    kind: str
    status: str
    created_at: str
    finished_at: str | None
    label: str | None
    endpoint: str
    model: str | None
    engine: str | None
    engine_version: str | None
    deployment: str | None
    meta: Mapping[str, Any]
    note: str | None


@dataclass(frozen=True)
class StoredSample:
    """One measured tier repeat."""

    tier: str
    repeat: int
    metrics: Mapping[str, Any]
    requests: tuple[RequestRecord, ...]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class BenchStore:
    """Bench tables on top of the shared Store."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store or Store()
        self.store.ensure(SCHEMA)

    def create_run(
        self,
        kind: str,
        endpoint: str,
        *,
        model: str | None,
        engine: str | None,
        engine_version: str | None,
        deployment: str | None,
        meta: Mapping[str, Any],
        label: str | None = None,
    ) -> int:
        """Record a new run as ``running``; returns its id."""
        with self.store.connect() as conn:
            cur = conn.execute(
                "INSERT INTO bench_runs (kind, status, created_at, label, endpoint, model, engine,"
                " engine_version, deployment, meta) VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    kind,
                    _now(),
                    label,
                    endpoint,
                    model,
                    engine,
                    engine_version,
                    deployment,
                    json.dumps(meta, default=str),
                ),
            )
            return int(cur.lastrowid or 0)

    def add_sample(
        self, run_id: int, tier: str, repeat: int, metrics: Any, requests: tuple[RequestRecord, ...]
    ) -> None:
        """Store one measured tier repeat (``metrics`` is a dataclass or a mapping)."""
        data = asdict(metrics) if hasattr(metrics, "__dataclass_fields__") else dict(metrics)
        with self.store.connect() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO bench_samples (run_id, tier, repeat, metrics, requests) VALUES (?, ?, ?, ?, ?)",
                (run_id, tier, repeat, json.dumps(data), json.dumps([r.to_json() for r in requests])),
            )

    def update_meta(self, run_id: int, **extra: Any) -> None:
        """Merge keys into a run's metadata (facts learned during the run)."""
        run = self.get_run(run_id)
        meta = {**run.meta, **extra}
        with self.store.connect() as conn:
            conn.execute("UPDATE bench_runs SET meta = ? WHERE id = ?", (json.dumps(meta, default=str), run_id))

    def has_run(self, run_id: int) -> bool:
        with self.store.connect() as conn:
            return conn.execute("SELECT 1 FROM bench_runs WHERE id = ?", (run_id,)).fetchone() is not None

    def discard_if_empty(self, run_id: int) -> bool:
        """Delete the run if it holds no measured sample (it measured nothing); True if it did."""
        with self.store.connect() as conn:
            if conn.execute("SELECT 1 FROM bench_samples WHERE run_id = ? LIMIT 1", (run_id,)).fetchone():
                return False
            conn.execute("DELETE FROM bench_runs WHERE id = ?", (run_id,))
            return True

    def finish_run(self, run_id: int, status: str, note: str | None = None) -> None:
        """Mark a run ``complete`` or ``partial``."""
        with self.store.connect() as conn:
            conn.execute(
                "UPDATE bench_runs SET status = ?, finished_at = ?, note = ? WHERE id = ?",
                (status, _now(), note, run_id),
            )

    def list_runs(self, limit: int = 20, kind: str | None = None) -> list[StoredRun]:
        """Most recent runs first."""
        sql = "SELECT * FROM bench_runs" + (" WHERE kind = ?" if kind else "") + " ORDER BY id DESC LIMIT ?"
        args: tuple[Any, ...] = (kind, limit) if kind else (limit,)
        with self.store.connect() as conn:
            return [_run(row) for row in conn.execute(sql, args).fetchall()]

    def resolve(self, ref: str) -> int:
        """A run id from ``7``, ``last``/``latest`` or ``last~N`` (N runs before the last)."""
        ref = ref.strip()
        back = 0
        if ref.startswith(("last", "latest")):
            _, _, tail = ref.partition("~")
            if tail and not tail.isdigit():
                raise BenchError(f"bad run reference {ref!r}: use an id, 'last' or 'last~N'")
            back = int(tail or 0)
            runs = self.list_runs(limit=back + 1)
            if len(runs) <= back:
                raise BenchError(f"no bench run {ref!r}: only {len(runs)} stored")
            return runs[back].id
        if not ref.isdigit():
            raise BenchError(f"bad run reference {ref!r}: use an id from `sparkfleet bench show`, 'last' or 'last~N'")
        return int(ref)

    def get_run(self, run_id: int) -> StoredRun:
        """One run, or BenchError naming the id."""
        with self.store.connect() as conn:
            row = conn.execute("SELECT * FROM bench_runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise BenchError(f"no bench run {run_id} in {self.store.path}")
        return _run(row)

    def samples(self, run_id: int, with_requests: bool = True) -> list[StoredSample]:
        """A run's measured samples, in the order they were taken."""
        with self.store.connect() as conn:
            rows = conn.execute(
                "SELECT tier, repeat, metrics, requests FROM bench_samples WHERE run_id = ? ORDER BY rowid",
                (run_id,),
            ).fetchall()
        out = []
        for row in rows:
            reqs = tuple(RequestRecord.from_json(r) for r in json.loads(row["requests"])) if with_requests else ()
            out.append(StoredSample(row["tier"], int(row["repeat"]), json.loads(row["metrics"]), reqs))
        return out


def _run(row: sqlite3.Row) -> StoredRun:
    return StoredRun(
        id=int(row["id"]),
        kind=row["kind"],
        status=row["status"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        label=row["label"],
        endpoint=row["endpoint"],
        model=row["model"],
        engine=row["engine"],
        engine_version=row["engine_version"],
        deployment=row["deployment"],
        meta=json.loads(row["meta"] or "{}"),
        note=row["note"],
    )
