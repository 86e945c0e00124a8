"""The dashboard's Watch page: what ``sparkfleet watch`` recorded (the per-node series and the
deployment's events timeline), shaped for the charts."""

from __future__ import annotations

from typing import Any

from sparkfleet.dashboard.data import NotFound
from sparkfleet.state.deployments import Deployments
from sparkfleet.state.store import Store
from sparkfleet.state.watch_series import WatchSeries

# The page draws at most this many polls (the newest); the store may keep more.
POINTS = 2000
EVENTS = 500


def watched(store: Store) -> list[str]:
    """Deployments that watch has samples of."""
    return WatchSeries(store).names()


def watch_series(store: Store, name: str) -> dict[str, Any]:
    """Per node, per poll: MemAvailable; for the head node also KV usage and running requests;
    and the events timeline, oldest first."""
    series = WatchSeries(store)
    rows = series.samples(name, limit=POINTS * 8)
    if not rows:
        raise NotFound(f"no watch samples of {name!r}: run `sparkfleet watch {name}`")
    times = sorted({r["time"] for r in rows})[-POINTS:]
    index = {t: i for i, t in enumerate(times)}
    nodes: dict[str, dict[str, list[float | None]]] = {}
    for row in rows:
        if row["time"] not in index:
            continue
        per = nodes.setdefault(row["node"], {k: [None] * len(times) for k in ("mem_available", "kv_usage", "running",
                                                                                "waiting")})  # fmt: skip
        for key in per:
            per[key][index[row["time"]]] = row[key]
    return {"name": name, "times": times, "nodes": nodes,
            "events": Deployments(store).events(name, limit=EVENTS)}  # fmt: skip
