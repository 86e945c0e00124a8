"""The last doctor run per node, kept in the state store so the dashboard can show it.

``sparkfleet doctor`` records every run; a node's row is replaced by its newest run, and checks
about the whole fleet are kept under the node name ``fleet``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sparkfleet.doctor.checks import Check
from sparkfleet.state.store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS doctor_last (
    node TEXT PRIMARY KEY,
    run_at REAL NOT NULL,
    seconds REAL NOT NULL,
    recipe TEXT,
    checks_json TEXT NOT NULL     -- JSON list of {id, node, status, evidence, fix}
);
CREATE TABLE IF NOT EXISTS doctor_fabric (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_at REAL NOT NULL,
    seconds REAL NOT NULL,
    recipe TEXT,
    report_json TEXT NOT NULL     -- doctor --fabric --json: the pairs' figures, rounds and checks
);
"""


@dataclass(frozen=True)
class NodeDoctor:
    """One node's checks from its newest doctor run."""

    node: str
    run_at: float
    seconds: float
    recipe: str | None
    checks: tuple[dict[str, Any], ...]

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        return {s: sum(1 for c in self.checks if c.get("status") == s) for s in ("pass", "warn", "fail")}


def record_doctor(store: Store, checks: Iterable[Check], seconds: float, recipe: str | None = None) -> None:
    """Replace each checked node's row with this run's checks."""
    by_node: dict[str, list[dict[str, Any]]] = {}
    for check in checks:
        by_node.setdefault(check.node, []).append(asdict(check))
    now = time.time()
    store.ensure(SCHEMA)
    with store.connect() as conn:
        for node, rows in by_node.items():
            conn.execute(
                "INSERT OR REPLACE INTO doctor_last (node, run_at, seconds, recipe, checks_json)"
                " VALUES (?, ?, ?, ?, ?)",
                (node, now, seconds, recipe, json.dumps(rows)),
            )


def last_doctor(store: Store) -> list[NodeDoctor]:
    """Every node's newest doctor run, nodes by name (``fleet`` last)."""
    store.ensure(SCHEMA)
    with store.connect(write=False) as conn:
        rows = conn.execute("SELECT * FROM doctor_last").fetchall()
    out = [
        NodeDoctor(r["node"], r["run_at"], r["seconds"], r["recipe"], tuple(json.loads(r["checks_json"]))) for r in rows
    ]
    return sorted(out, key=lambda d: (d.node == "fleet", d.node))


def record_fabric(store: Store, report: dict[str, Any], seconds: float, recipe: str | None = None) -> None:
    """Keep one `doctor --fabric` run (every run: a pair's figures are compared across days)."""
    store.ensure(SCHEMA)
    with store.connect() as conn:
        conn.execute(
            "INSERT INTO doctor_fabric (run_at, seconds, recipe, report_json) VALUES (?, ?, ?, ?)",
            (time.time(), seconds, recipe, json.dumps(report)),
        )


def last_fabric(store: Store) -> dict[str, Any] | None:
    """The newest `doctor --fabric` report (its --json form, with run_at), or None."""
    store.ensure(SCHEMA)
    with store.connect() as conn:
        row = conn.execute("SELECT * FROM doctor_fabric ORDER BY id DESC LIMIT 1").fetchone()
    if row is None:
        return None
    return {**json.loads(row["report_json"]), "run_at": row["run_at"], "recipe": row["recipe"]}
