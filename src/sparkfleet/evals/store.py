"""Eval runs in the state store: one row per run, the full result as JSON beside a summary."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkfleet.errors import EvalError
from sparkfleet.state.store import Store

if TYPE_CHECKING:
    from sparkfleet.evals.needle import NeedleRun
    from sparkfleet.evals.results import QualityRun

SCHEMA = """
CREATE TABLE IF NOT EXISTS eval_runs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,            -- quality | needle
    label TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    model TEXT NOT NULL,
    created_utc TEXT NOT NULL,
    passed INTEGER NOT NULL,
    total INTEGER NOT NULL,
    result_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS eval_runs_label ON eval_runs(label, created_utc);
"""


@dataclass(frozen=True)
class RunRow:
    """The summary columns of one stored run."""

    id: str
    kind: str
    label: str
    endpoint: str
    model: str
    created_utc: str
    passed: int
    total: int


def save_run(store: Store, row: RunRow, result: dict[str, Any]) -> None:
    """Insert (or replace) one run."""
    store.ensure(SCHEMA)
    with store.connect() as conn:
        conn.execute(
            "INSERT OR REPLACE INTO eval_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.id,
                row.kind,
                row.label,
                row.endpoint,
                row.model,
                row.created_utc,
                row.passed,
                row.total,
                json.dumps(result),
            ),
        )


def save(store: Store, kind: str, run: QualityRun | NeedleRun) -> None:
    """Store a finished quality or needle run under its id."""
    row = RunRow(run.id, kind, run.label, run.endpoint, run.model, run.started_utc, run.passed, run.total)
    save_run(store, row, run.to_json())


def list_runs(store: Store, kind: str | None = None, limit: int = 30) -> list[RunRow]:
    """The newest runs first."""
    store.ensure(SCHEMA)
    with store.connect(write=False) as conn:
        rows = conn.execute(
            "SELECT id, kind, label, endpoint, model, created_utc, passed, total FROM eval_runs "
            "WHERE (? IS NULL OR kind = ?) ORDER BY created_utc DESC, rowid DESC LIMIT ?",
            (kind, kind, limit),
        ).fetchall()
    return [RunRow(*tuple(r)) for r in rows]


def load_run(store: Store, ref: str, kind: str | None = None, *, files: bool = True) -> dict[str, Any]:
    """A run's result by id, by label (the newest with that label) or, with files, from a JSON
    file path (the CLI's; the dashboard serves stored runs only)."""
    path = Path(ref)
    if files and ref.endswith(".json") and path.is_file():
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise EvalError(f"{path}: not a readable eval result ({exc})") from exc
        return data
    store.ensure(SCHEMA)
    with store.connect(write=False) as conn:
        row = conn.execute(
            "SELECT result_json FROM eval_runs WHERE (id = ? OR label = ?) AND (? IS NULL OR kind = ?) "
            "ORDER BY (id = ?) DESC, created_utc DESC LIMIT 1",
            (ref, ref, kind, kind, ref),
        ).fetchone()
    if row is None:
        what = f"{kind} run" if kind else "eval run"
        raise EvalError(f"no {what} with id or label {ref!r} in {store.path}; `sparkfleet eval show` lists them")
    loaded: dict[str, Any] = json.loads(row[0])
    return loaded
