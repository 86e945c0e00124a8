"""The gateway's own SQLite file, ``gateway.db`` in the state dir, readable by its owner alone: its
API keys (hashes only) and its request log. Kept apart from ``state.db``, which other tools and the
dashboard read, so the file that holds key hashes can be 0600 whatever the rest is."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

from sparkfleet.errors import StateError
from sparkfleet.state.store import state_dir

SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    hash BLOB NOT NULL,
    models TEXT,
    rpm INTEGER,
    tpm INTEGER,
    expires REAL,
    created REAL NOT NULL,
    revoked REAL
);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    request_id TEXT NOT NULL,
    key_name TEXT,
    model TEXT,
    deployment TEXT,
    status INTEGER NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    ttft REAL,
    e2e REAL,
    finish_reason TEXT,
    clamped INTEGER NOT NULL DEFAULT 0,
    loop_aborted INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    request_body TEXT,
    response_text TEXT,
    held REAL
);
CREATE INDEX IF NOT EXISTS requests_by_time ON requests(time);
"""


def db_path() -> Path:
    return state_dir() / "gateway.db"


def connect(path: Path | None = None) -> sqlite3.Connection:
    """A connection to the gateway's database, created 0600 (its folder 0700) on first use."""
    path = path or db_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        os.chmod(path, 0o600)
        conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        # The log's rows may be lost in a power cut, never corrupted; a commit then needs no fsync.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(SCHEMA)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(requests)")}
        if "held" not in columns:  # a gateway.db from before the hold (issue 34)
            conn.execute("ALTER TABLE requests ADD COLUMN held REAL")
    except (OSError, sqlite3.Error) as exc:
        raise StateError(f"cannot open the gateway database {path}: {exc}") from exc
    for side in ("-wal", "-shm"):  # SQLite creates these with the umask's mode
        p = path.with_name(path.name + side)
        if p.exists():
            os.chmod(p, 0o600)
    return conn


def read_log(conn: sqlite3.Connection, since: float | None, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` rows since a time, oldest first."""
    rows = conn.execute(
        "SELECT * FROM requests WHERE time >= ? ORDER BY id DESC LIMIT ?", (since or 0.0, limit)
    ).fetchall()
    out = []
    for r in reversed(rows):
        d = dict(r)
        d.pop("id", None)
        if d.get("request_body"):
            with contextlib.suppress(ValueError):
                d["request_body"] = json.loads(d["request_body"])
        out.append(d)
    return out
