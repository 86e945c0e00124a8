"""A/B experiments in the state store: the experiment, each finished round as it ends (so an
interrupted experiment keeps them), and the report once it is made."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from sparkfleet.errors import NotFoundError
from sparkfleet.state.store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS experiments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    recipe TEXT NOT NULL,
    name TEXT NOT NULL,
    variant_a TEXT NOT NULL,
    variant_b TEXT NOT NULL,
    rounds INTEGER NOT NULL,
    config_json TEXT NOT NULL,
    status TEXT NOT NULL,
    note TEXT,
    report_json TEXT
);
CREATE TABLE IF NOT EXISTS experiment_rounds (
    experiment INTEGER NOT NULL REFERENCES experiments(id),
    round INTEGER NOT NULL,
    position INTEGER NOT NULL,
    variant TEXT NOT NULL,
    data_json TEXT NOT NULL,
    PRIMARY KEY (experiment, round, variant)
);
"""


@dataclass
class VariantRound:
    """One variant's part of one round: up, measured, down."""

    round: int
    position: int  # 0: ran first in its round, 1: second
    variant: str
    ready_s: float
    metrics: dict[str, list[float]] = field(default_factory=dict)  # metric -> this round's repeats
    units: dict[str, str] = field(default_factory=dict)
    higher_is_better: dict[str, bool] = field(default_factory=dict)
    quality: dict[str, bool] | None = None  # task id -> passed
    bench_runs: list[int] = field(default_factory=list)
    quality_run: str | None = None
    figures: dict[str, float] = field(default_factory=dict)  # what the engine printed (KV pool, memory)
    configuration: int | None = None


@dataclass(frozen=True)
class Experiment:
    id: int
    created: float
    recipe: str
    name: str
    variants: tuple[str, str]
    rounds: int
    config: dict[str, Any]
    status: str
    note: str | None
    report: dict[str, Any] | None


class Experiments:
    """CRUD over the experiments tables."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store or Store()
        self.store.ensure(SCHEMA)

    def create(self, recipe: str, name: str, variants: tuple[str, str], rounds: int, config: dict[str, Any]) -> int:
        with self.store.connect() as conn:
            cur = conn.execute(
                "INSERT INTO experiments (created, recipe, name, variant_a, variant_b, rounds, config_json, status)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 'running')",
                (time.time(), recipe, name, variants[0], variants[1], rounds, json.dumps(config)),
            )
            return int(cur.lastrowid or 0)

    def add_round(self, experiment: int, part: VariantRound) -> None:
        with self.store.connect() as conn:
            conn.execute("INSERT OR REPLACE INTO experiment_rounds (experiment, round, position, variant, data_json)"
                         " VALUES (?, ?, ?, ?, ?)",
                         (experiment, part.round, part.position, part.variant, json.dumps(part.__dict__)))  # fmt: skip

    def finish(self, experiment: int, status: str, report: dict[str, Any] | None, note: str | None = None) -> None:
        with self.store.connect() as conn:
            conn.execute("UPDATE experiments SET status = ?, report_json = ?, note = ? WHERE id = ?",
                         (status, json.dumps(report) if report is not None else None, note, experiment))  # fmt: skip

    def rounds(self, experiment: int) -> list[VariantRound]:
        with self.store.connect() as conn:
            rows = conn.execute("SELECT data_json FROM experiment_rounds WHERE experiment = ? ORDER BY round, position",
                                (experiment,)).fetchall()  # fmt: skip
        return [VariantRound(**json.loads(r["data_json"])) for r in rows]

    def get(self, experiment: int) -> Experiment:
        with self.store.connect() as conn:
            row = conn.execute("SELECT * FROM experiments WHERE id = ?", (experiment,)).fetchone()
        if row is None:
            raise NotFoundError(f"no experiment {experiment} in {self.store.path}")
        return _from_row(row)

    def all(self, limit: int = 100) -> list[Experiment]:
        with self.store.connect() as conn:
            rows = conn.execute("SELECT * FROM experiments ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [_from_row(r) for r in rows]


def _from_row(row: Any) -> Experiment:
    return Experiment(
        id=row["id"], created=row["created"], recipe=row["recipe"], name=row["name"],
        variants=(row["variant_a"], row["variant_b"]), rounds=row["rounds"], config=json.loads(row["config_json"]),
        status=row["status"], note=row["note"], report=json.loads(row["report_json"]) if row["report_json"] else None,
    )  # fmt: skip
