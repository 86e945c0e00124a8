"""Deployment records in the state store: the lock that stops a second ``up``, the ranks as
started (enough to find and stop them later), and a timeline of events."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

from sparkfleet.errors import StateError
from sparkfleet.nodes.identity import Instance
from sparkfleet.plan.engines import Readiness
from sparkfleet.plan.model import MountSpec, Plan, RankPlan
from sparkfleet.spec.cluster import Node
from sparkfleet.spec.secrets import redact
from sparkfleet.state.store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS deployments (
    name TEXT PRIMARY KEY,
    engine TEXT NOT NULL,
    recipe TEXT NOT NULL,
    cluster TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    served_model TEXT NOT NULL,
    status TEXT NOT NULL,
    owner_pid INTEGER,
    owner_host TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    ready_at REAL,
    ranks_json TEXT NOT NULL,
    instance TEXT,
    owner TEXT
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    node TEXT,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_name ON events(name, time);
"""


@dataclass(frozen=True)
class Deployment:
    """A deployment as recorded: what ``status``, ``logs`` and ``down`` work from."""

    name: str
    engine: str
    recipe: str
    cluster: str
    endpoint: str
    served_model: str
    status: str
    created: float
    updated: float
    ready_at: float | None
    ranks: tuple[RankPlan, ...]
    instance: str | None = None  # None: recorded before instance ids (stops match by name)
    owner: str | None = None


def rank_to_json(rank: RankPlan) -> dict[str, Any]:
    """The parts of a RankPlan needed to find, watch and stop it (no env: secrets stay out)."""
    return {
        "rank": rank.rank,
        "node": rank.node.model_dump(),
        "runtime": rank.runtime,
        "image": rank.image,
        "argv": list(rank.argv),
        "mounts": [asdict(m) for m in rank.mounts],
        "container_name": rank.container_name,
        "workdir": rank.workdir,
        "env_file": rank.env_file,
        "log_path": rank.log_path,
        "pid_path": rank.pid_path,
        "readiness": asdict(rank.readiness),
        "ports": list(rank.ports),
    }


def rank_from_json(data: dict[str, Any]) -> RankPlan:
    """A RankPlan rebuilt from its record (without env, which is never stored)."""
    return RankPlan(
        rank=data["rank"],
        node=Node.model_validate(data["node"]),
        runtime=data["runtime"],
        image=data["image"],
        argv=tuple(data["argv"]),
        env=(),
        mounts=tuple(MountSpec(**m) for m in data["mounts"]),
        container_name=data["container_name"],
        container_argv=None,
        workdir=data["workdir"],
        env_file=data["env_file"],
        log_path=data["log_path"],
        pid_path=data["pid_path"],
        readiness=Readiness(**data["readiness"]),
        ports=tuple(data["ports"]),
    )


def _alive(pid: int | None, host: str | None) -> bool:
    """Whether the ``up`` that holds a lock still runs (another machine's: assume it does)."""
    if pid is None:
        return False
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Deployments:
    """CRUD over the deployments and events tables."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store or Store()
        self.store.ensure(SCHEMA)
        # A state store written before instance ids lacks the columns.
        self.store.add_columns("deployments", {"instance": "TEXT", "owner": "TEXT"})

    def acquire(self, plan: Plan, cluster_source: str, instance: Instance) -> None:
        """Record plan as starting, or refuse if a deployment of that name is up or starting."""
        now = time.time()
        with self.store.connect() as conn:
            row = conn.execute("SELECT status, owner_pid, owner_host FROM deployments WHERE name = ?",
                               (plan.name,)).fetchone()  # fmt: skip
            # A "starting" row whose up process died is stale: take it over.
            if row and (row["status"] == "ready" or (row["status"] == "starting"
                                                     and _alive(row["owner_pid"], row["owner_host"]))):
                raise StateError(
                    f"deployment {plan.name!r} is already {row['status']}; "
                    f"run `sparkfleet down {plan.name}` first (or `up --name` for a second copy)"
                )
            conn.execute("DELETE FROM deployments WHERE name = ?", (plan.name,))
            conn.execute(
                "INSERT INTO deployments (name, engine, recipe, cluster, endpoint, served_model, status,"
                " owner_pid, owner_host, created, updated, ranks_json, instance, owner)"
                " VALUES (?, ?, ?, ?, ?, ?, 'starting', ?, ?, ?, ?, ?, ?, ?)",
                (plan.name, plan.engine, plan.recipe_source, cluster_source, plan.endpoint, plan.served_model,
                 os.getpid(), socket.gethostname(), now, now,
                 json.dumps([rank_to_json(r) for r in plan.ranks]), instance.id, instance.owner),
            )  # fmt: skip

    def set_status(self, name: str, status: str) -> None:
        """Move a deployment to a new status (ready also records when)."""
        now = time.time()
        with self.store.connect() as conn:
            conn.execute(
                "UPDATE deployments SET status = ?, updated = ?, ready_at = CASE WHEN ? = 'ready' THEN ?"
                " ELSE ready_at END WHERE name = ?",
                (status, now, status, now, name),
            )

    def event(self, name: str, kind: str, message: str, node: str | None = None,
              env: dict[str, str] | None = None) -> None:  # fmt: skip
        """Append to the deployment's timeline (secret values redacted)."""
        with self.store.connect() as conn:
            conn.execute("INSERT INTO events (name, time, kind, node, message) VALUES (?, ?, ?, ?, ?)",
                         (name, time.time(), kind, node, redact(message, env or {})))  # fmt: skip

    def get(self, name: str) -> Deployment | None:
        """The recorded deployment, or None."""
        with self.store.connect() as conn:
            row = conn.execute("SELECT * FROM deployments WHERE name = ?", (name,)).fetchone()
        return _from_row(row) if row else None

    def all(self) -> list[Deployment]:
        """Every recorded deployment, newest first."""
        with self.store.connect() as conn:
            rows = conn.execute("SELECT * FROM deployments ORDER BY created DESC").fetchall()
        return [_from_row(r) for r in rows]

    def events(self, name: str, limit: int = 50) -> list[dict[str, Any]]:
        """The latest events of a deployment, oldest first."""
        with self.store.connect() as conn:
            rows = conn.execute("SELECT time, kind, node, message FROM events WHERE name = ? "
                                "ORDER BY id DESC LIMIT ?", (name, limit)).fetchall()  # fmt: skip
        return [dict(r) for r in reversed(rows)]


def _from_row(row: Any) -> Deployment:
    return Deployment(
        name=row["name"],
        engine=row["engine"],
        recipe=row["recipe"],
        cluster=row["cluster"],
        endpoint=row["endpoint"],
        served_model=row["served_model"],
        status=row["status"],
        created=row["created"],
        updated=row["updated"],
        ready_at=row["ready_at"],
        ranks=tuple(rank_from_json(r) for r in json.loads(row["ranks_json"])),
        instance=row["instance"],
        owner=row["owner"],
    )
