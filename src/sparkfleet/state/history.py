"""Every configuration a deployment name was brought up with, and whether it passed its gate:
what ``sparkfleet rollback`` goes back to.

A row is one ``up`` (by ``up``, ``ab`` or ``rollback``): the recipe file's digest and its data as
read (secret values masked), the variant, the ``--set`` and ``--env`` given (secret values
masked), the cluster file, each node's image ID, and the gate — ready and smoke-tested, and a
quality run's result when one was made against that instance."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sparkfleet.state.store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS configurations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    instance TEXT,
    time REAL NOT NULL,
    recipe TEXT NOT NULL,
    recipe_digest TEXT NOT NULL,
    variant TEXT NOT NULL,
    sets_json TEXT NOT NULL,
    env_json TEXT NOT NULL,
    cluster TEXT,
    recipe_json TEXT NOT NULL,
    image_ids_json TEXT NOT NULL,
    ready INTEGER NOT NULL,
    quality_json TEXT,
    passed INTEGER NOT NULL,
    note TEXT
);
CREATE INDEX IF NOT EXISTS configurations_by_name ON configurations(name, id);
"""


@dataclass(frozen=True)
class Configuration:
    """One recorded ``up`` of a deployment name."""

    id: int
    name: str
    instance: str | None
    time: float
    recipe: str
    recipe_digest: str
    variant: str
    sets: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # secret values masked
    cluster: str | None
    recipe_data: dict[str, Any]  # the recipe file as read, secret values masked
    image_ids: dict[str, str | None]  # node -> image ID (empty for host processes)
    ready: bool
    quality: dict[str, Any] | None
    passed: bool
    note: str | None

    @property
    def key(self) -> tuple[str, str, tuple[str, ...], tuple[tuple[str, str], ...], str | None]:
        """What makes two ups the same configuration."""
        return (self.recipe_digest, self.variant, self.sets, self.env, self.cluster)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time))
        images = ", ".join(sorted({i[:19] for i in self.image_ids.values() if i})) or "host processes"
        return (f"#{self.id} {when}: {self.recipe} variant {self.variant} (digest {self.recipe_digest[:12]}, "
                f"{images}){' ' + ' '.join('--set ' + s for s in self.sets) if self.sets else ''}")  # fmt: skip


class History:
    """The configurations table."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store or Store()
        self.store.ensure(SCHEMA)

    def add(self, *, name: str, instance: str | None, recipe: str, recipe_digest: str, variant: str,
            sets: tuple[str, ...], env: tuple[tuple[str, str], ...], cluster: str | None,
            recipe_data: dict[str, Any], image_ids: dict[str, str | None], ready: bool,
            note: str | None = None) -> int:  # fmt: skip
        with self.store.connect() as conn:
            cur = conn.execute(
                "INSERT INTO configurations (name, instance, time, recipe, recipe_digest, variant, sets_json,"
                " env_json, cluster, recipe_json, image_ids_json, ready, passed, note)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (name, instance, time.time(), recipe, recipe_digest, variant, json.dumps(list(sets)),
                 json.dumps([list(p) for p in env]), cluster, json.dumps(recipe_data), json.dumps(image_ids),
                 int(ready), int(ready), note),
            )  # fmt: skip
            return int(cur.lastrowid or 0)

    def set_quality(self, config_id: int, quality: dict[str, Any], passed: bool) -> None:
        """A quality run made against this configuration, and whether it kept the gate passed."""
        with self.store.connect() as conn:
            conn.execute("UPDATE configurations SET quality_json = ?, passed = ready AND ? WHERE id = ?",
                         (json.dumps(quality), int(passed), config_id))  # fmt: skip

    def of(self, name: str) -> list[Configuration]:
        """Every configuration of name, newest first."""
        with self.store.connect(write=False) as conn:
            rows = conn.execute("SELECT * FROM configurations WHERE name = ? ORDER BY id DESC", (name,)).fetchall()
        return [_from_row(r) for r in rows]

    def current(self, name: str, instance: str | None) -> Configuration | None:
        """The configuration of a recorded instance."""
        return next((c for c in self.of(name) if instance is not None and c.instance == instance), None)


def _from_row(row: Any) -> Configuration:
    return Configuration(
        id=row["id"],
        name=row["name"],
        instance=row["instance"],
        time=row["time"],
        recipe=row["recipe"],
        recipe_digest=row["recipe_digest"],
        variant=row["variant"],
        sets=tuple(json.loads(row["sets_json"])),
        env=tuple((k, v) for k, v in json.loads(row["env_json"])),
        cluster=row["cluster"],
        recipe_data=json.loads(row["recipe_json"]),
        image_ids=json.loads(row["image_ids_json"]),
        ready=bool(row["ready"]),
        quality=json.loads(row["quality_json"]) if row["quality_json"] else None,
        passed=bool(row["passed"]),
        note=row["note"],
    )
