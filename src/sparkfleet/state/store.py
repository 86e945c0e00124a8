"""The local SQLite store: deployments, ranks, events, bench and eval runs.

Each feature owns its tables and declares them with ``Store.ensure(schema)``; the store only
knows where the file lives and how to open it safely (WAL, one writer at a time).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sparkfleet.errors import StateError
from sparkfleet.nodes.private import private_dir, private_file

STATE_DIR_ENV = "SPARKFLEET_STATE_DIR"
LOCK_WAIT_S = 15.0  # how long a writer waits for another's transaction (they last milliseconds)


def state_dir() -> Path:
    """Where this user's sparkfleet state lives (``$SPARKFLEET_STATE_DIR`` wins)."""
    override = os.environ.get(STATE_DIR_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sparkfleet"


def _disk_full(path: Path) -> bool:
    try:
        return os.statvfs(path.parent).f_bavail == 0
    except OSError:
        return False


class Store:
    """One SQLite database file; connections are short-lived and transactions atomic."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path else state_dir() / "state.db"
        self._ensured: set[str] = set()
        self._prepared = False

    def prepare(self) -> None:
        """The state dir private (0700, this user's, no symlink) and the database file 0600
        before SQLite opens it: it holds endpoints, plans and events of every deployment."""
        if self._prepared:
            return
        private_dir(self.path.parent, parents=True)
        private_file(self.path)
        self._prepared = True

    @contextmanager
    def connect(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """A connection inside one transaction: committed on success, rolled back on error.

        Writers take the write lock at once (``BEGIN IMMEDIATE``: a read-then-write never
        deadlocks); readers (``write=False``) never take it, so in WAL mode they read the last
        committed state while another sparkfleet writes. A store still locked after
        ``LOCK_WAIT_S``, or a full disk, is one line naming the store."""
        try:
            self.prepare()
            conn = sqlite3.connect(self.path, timeout=LOCK_WAIT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StateError(f"cannot open the state store {self.path}: {exc}") from exc
        conn.row_factory = sqlite3.Row
        try:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA foreign_keys=ON")
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                raise self._error(exc) from exc
        finally:
            conn.close()

    def _error(self, exc: sqlite3.Error) -> StateError:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StateError(f"the state store {self.path} is locked by another sparkfleet command (waited "
                              f"{LOCK_WAIT_S:.0f} s): try again when it is done")  # fmt: skip
        if "full" in text or "disk I/O" in text or _disk_full(self.path):
            return StateError(f"the state store {self.path} cannot be written: the disk is full ({text})")
        return StateError(f"the state store {self.path}: {text}")

    def ensure(self, schema: str) -> None:
        """Create tables and indexes (idempotent ``CREATE … IF NOT EXISTS`` statements)."""
        if schema in self._ensured:
            return
        self.prepare()
        conn = sqlite3.connect(self.path, timeout=LOCK_WAIT_S)
        try:
            conn.executescript(schema)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        finally:
            conn.close()
        self._ensured.add(schema)

    def add_columns(self, table: str, columns: dict[str, str]) -> None:
        """Add the columns a newer sparkfleet needs to a table an older one created."""
        key = f"{table}:{sorted(columns)}"
        if key in self._ensured:
            return
        with self.connect(write=False) as conn:  # every command asks; only an older store needs the write
            have = {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}
        if set(columns) - have:
            with self.connect() as conn:
                have = {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}
                for name, kind in columns.items():
                    if name not in have:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
        self._ensured.add(key)
