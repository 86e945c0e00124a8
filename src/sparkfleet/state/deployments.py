"""Deployment records in the state store: the lock that stops a second ``up``, the ranks as
started (their RankHandles: enough to find, watch and stop them later), and a timeline of events."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from sparkfleet.config.cluster import Node, NodeSpec, parse_cluster
from sparkfleet.config.secrets import redact
from sparkfleet.config.validation import did_you_mean
from sparkfleet.errors import NotFoundError, SparkfleetError, StateError
from sparkfleet.nodes.identity import Instance, when
from sparkfleet.plan.engines import Readiness
from sparkfleet.plan.model import MountSpec, Plan, RankHandle
from sparkfleet.state.plans import plan_from_json, plan_to_json
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
    ranks: tuple[RankHandle, ...]
    instance: str | None = None  # None: recorded before instance ids (stops match by name)
    owner: str | None = None
    restarts: int = 0  # how often watch's restart policy brought it up again
    owner_pid: int | None = None  # the controller process of the up that made the record
    owner_host: str | None = None
    unreadable: str | None = None  # why its ranks could not be read (a record of an older version)


def rank_to_json(rank: RankHandle) -> dict[str, Any]:
    """A rank's handle as stored (no env: secrets stay out). The keys are the ones every
    sparkfleet has written, so a record from any version loads."""
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
        "stop_wave": rank.stop_wave,
    }


_READINESS_KEYS = {f.name for f in fields(Readiness)}


def _node_from_json(data: dict[str, Any]) -> Node:
    """The node as recorded; a record from a version whose Node had fewer fields gets the ones it
    lacks as a cluster file that names only what it has would give them."""
    if set(Node.model_fields) <= set(data):
        return Node.model_validate({k: v for k, v in data.items() if k in Node.model_fields})
    spec = {k: v for k, v in data.items() if k in NodeSpec.model_fields and v is not None}
    resolved = parse_cluster({"name": "record", "nodes": [spec]}, "the state store").nodes[0]
    return Node.model_validate({**resolved.model_dump(), **{k: v for k, v in data.items() if k in Node.model_fields}})


_MOUNT_KEYS = {f.name for f in fields(MountSpec)}


def rank_from_json(data: dict[str, Any]) -> RankHandle:
    """A rank's handle from its record. Keys a record may lack (or carry from another version)
    take their defaults, and a container name is derived as ``up`` named it."""
    readiness = {k: v for k, v in (data.get("readiness") or {}).items() if k in _READINESS_KEYS}
    readiness.setdefault("serves_http", data["rank"] == 0)
    readiness.setdefault("health_path", None)
    readiness.setdefault("ready_log", None)
    return RankHandle(
        rank=data["rank"],
        node=_node_from_json(data["node"]),
        runtime=data.get("runtime", "docker" if data.get("image") else "process"),
        image=data.get("image"),
        argv=tuple(data.get("argv") or ()),
        mounts=tuple(MountSpec(**{k: v for k, v in m.items() if k in _MOUNT_KEYS}) for m in data.get("mounts") or ()),
        container_name=data.get("container_name") or "",
        workdir=data.get("workdir", ""),
        env_file=data["env_file"],
        log_path=data["log_path"],
        pid_path=data["pid_path"],
        readiness=Readiness(**readiness),
        ports=tuple(data.get("ports") or ()),
        stop_wave=int(data.get("stop_wave") or 0),
    )


def gone(row: Any) -> str:
    """The dead controller of a record, for messages: pid, host, instance and start time."""
    return (f"pid {row['owner_pid']} on {row['owner_host']}, instance {row['instance'] or '?'}, "
            f"started {when(row['created'])}")  # fmt: skip


def controller_gone(deployment: Deployment) -> bool:
    """Whether the ``up`` that left a deployment ``starting`` has died (it will never finish)."""
    return deployment.status == "starting" and not _alive(deployment.owner_pid, deployment.owner_host)


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
        # The Plan itself (secrets masked), for watch's restart; how often watch restarted it.
        self.store.add_columns("deployments", {"plan_json": "TEXT", "restarts": "INTEGER"})

    def acquire(self, plan: Plan, cluster_source: str, instance: Instance) -> None:
        """Record plan as starting, or refuse if a deployment of that name is up or starting."""
        now = time.time()
        with self.store.connect() as conn:
            row = conn.execute("SELECT status, owner_pid, owner_host, instance, created FROM deployments"
                               " WHERE name = ?", (plan.name,)).fetchone()  # fmt: skip
            if row and row["status"] == "starting" and not _alive(row["owner_pid"], row["owner_host"]):
                # Its up was killed: its ranks may run on, and this record is all that names
                # them, so it is kept for `down`, not replaced.
                raise StateError(
                    f"deployment {plan.name!r} was being started by a controller that is gone ({gone(row)}); "
                    f"its ranks may still run: `sparkfleet down {plan.name}` stops them, then `up` again"
                )
            if row and row["status"] in ("ready", "starting"):
                raise StateError(
                    f"deployment {plan.name!r} is already {row['status']}; "
                    f"run `sparkfleet down {plan.name}` first (or `up --name` for a second copy)"
                )
            conn.execute("DELETE FROM deployments WHERE name = ?", (plan.name,))
            conn.execute(
                "INSERT INTO deployments (name, engine, recipe, cluster, endpoint, served_model, status,"
                " owner_pid, owner_host, created, updated, ranks_json, instance, owner, plan_json)"
                " VALUES (?, ?, ?, ?, ?, ?, 'starting', ?, ?, ?, ?, ?, ?, ?, ?)",
                (plan.name, plan.engine, plan.recipe_source, cluster_source, plan.endpoint, plan.served_model,
                 os.getpid(), socket.gethostname(), now, now,
                 json.dumps([rank_to_json(r.handle) for r in plan.ranks]), instance.id, instance.owner,
                 plan_to_json(plan)),
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

    def stored_plan(self, name: str) -> Plan | None:
        """The Plan the deployment was last brought up from (secret env values masked), or None
        for a record written before plans were stored."""
        with self.store.connect(write=False) as conn:
            row = conn.execute("SELECT plan_json FROM deployments WHERE name = ?", (name,)).fetchone()
        return plan_from_json(row["plan_json"]) if row and row["plan_json"] else None

    def set_restarts(self, name: str, count: int) -> None:
        """How many times watch brought the deployment up again (shown by status)."""
        with self.store.connect() as conn:
            conn.execute("UPDATE deployments SET restarts = ? WHERE name = ?", (count, name))

    def event(self, name: str, kind: str, message: str, node: str | None = None,
              env: dict[str, str] | None = None) -> None:  # fmt: skip
        """Append to the deployment's timeline (secret values redacted)."""
        self.events_at(name, [(time.time(), kind, message, node)], env)

    def events_at(self, name: str, entries: Sequence[tuple[float, str, str, str | None]],
                  env: dict[str, str] | None = None) -> None:  # fmt: skip
        """Append several ``(time, kind, message, node)`` events in one transaction: what the
        nodes of one phase did, recorded once the phase is over rather than by every node's
        thread in turn (each commit is a sync, and N threads queue on the write lock)."""
        if not entries:
            return
        with self.store.connect() as conn:
            rows = [(name, t, kind, node, redact(message, env or {})) for t, kind, message, node in entries]
            conn.executemany("INSERT INTO events (name, time, kind, node, message) VALUES (?, ?, ?, ?, ?)", rows)

    def get(self, name: str) -> Deployment | None:
        """The recorded deployment, or None."""
        with self.store.connect(write=False) as conn:
            row = conn.execute("SELECT * FROM deployments WHERE name = ?", (name,)).fetchone()
        return _from_row(row) if row else None

    def require(self, name: str, hint: str = "`sparkfleet status` lists them") -> Deployment:
        """The recorded deployment; NotFoundError naming the closest recorded name otherwise."""
        found = self.get(name)
        if found is None:
            with self.store.connect(write=False) as conn:
                names = [r["name"] for r in conn.execute("SELECT name FROM deployments")]
            raise NotFoundError(f"no deployment named {name!r}{did_you_mean(name, names)}; {hint}")
        return found

    def all(self) -> list[Deployment]:
        """Every recorded deployment, newest first."""
        with self.store.connect(write=False) as conn:
            rows = conn.execute("SELECT * FROM deployments ORDER BY created DESC").fetchall()
        return [_from_row(r) for r in rows]

    def events(self, name: str, limit: int = 50) -> list[dict[str, Any]]:
        """The latest events of a deployment, oldest first."""
        with self.store.connect(write=False) as conn:
            rows = conn.execute("SELECT time, kind, node, message FROM events WHERE name = ? "
                                "ORDER BY id DESC LIMIT ?", (name, limit)).fetchall()  # fmt: skip
        return [dict(r) for r in reversed(rows)]


def _from_row(row: Any) -> Deployment:
    """The record as a Deployment; one whose ranks this version cannot read (a host an older
    version let through, a changed layout) has none, and says why, so that status and down
    still work for it and for every other deployment."""
    try:
        ranks = tuple(rank_from_json(r) for r in json.loads(row["ranks_json"]))
        unreadable = None
    except (ValueError, TypeError, KeyError, AttributeError, SparkfleetError) as exc:
        ranks, unreadable = (), (exc.message if isinstance(exc, SparkfleetError) else str(exc)).splitlines()[0][:200]
    return Deployment(
        unreadable=unreadable,
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
        ranks=ranks,
        instance=row["instance"],
        owner=row["owner"],
        restarts=row["restarts"] or 0,
        owner_pid=row["owner_pid"],
        owner_host=row["owner_host"],
    )
