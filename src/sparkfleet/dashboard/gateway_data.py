"""The Gateway page: the routes a gateway serving this state dir makes of its deployments (with the
recipe's [serve] settings), the keys by name, and the newest rows of the request log. Read-only:
``gateway.db`` is opened read-only, and only when a gateway or a ``key create`` made it."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sparkfleet.apply.switch import CHANGE_EVENTS
from sparkfleet.gateway.config import GatewayConfig
from sparkfleet.gateway.routing import Router
from sparkfleet.state.store import Store

_COLUMNS = ("time", "request_id", "key_name", "model", "deployment", "status", "prompt_tokens",
            "completion_tokens", "ttft", "e2e", "finish_reason", "clamped", "loop_aborted")  # fmt: skip


def gateway(store: Store, limit: int = 50) -> dict[str, Any]:
    router = Router(GatewayConfig(), store.path)
    router.refresh()
    routes = [
        {
            "model": model,
            "max_new_tokens": state.route.max_new_tokens,
            "loop_abort": state.route.loop.enabled,
            "fields": dict(state.route.fields),
            "replicas": [{"name": r.name, "url": r.base, "upstream_model": r.upstream_model} for r in state.replicas],
        }
        for model, state in sorted(router.routes.items())
    ]
    path = store.path.parent / "gateway.db"
    keys: list[dict[str, Any]] = []
    requests: list[dict[str, Any]] = []
    if path.exists():
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        conn.row_factory = sqlite3.Row
        try:
            now = time.time()
            for r in conn.execute("SELECT name, id, models, rpm, tpm, expires, revoked FROM keys ORDER BY created"):
                state = "revoked" if r["revoked"] else "expired" if r["expires"] and r["expires"] <= now else "active"
                keys.append({"name": r["name"], "id": r["id"], "rpm": r["rpm"], "tpm": r["tpm"], "state": state})
            have = {r[1] for r in conn.execute("PRAGMA table_info(requests)")}
            columns = [*_COLUMNS, *(["held"] if "held" in have else [])]  # held: issue 34's, newer
            rows = conn.execute(f"SELECT {', '.join(columns)} FROM requests ORDER BY id DESC LIMIT ?", (limit,))
            requests = [dict(r) for r in rows]
        except sqlite3.Error:
            pass  # a gateway.db from before the request log: keys and rows as far as there are any
        finally:
            conn.close()
    return {"routes": routes, "keys": keys, "requests": requests, "changes": _changes(store, limit)}


def _changes(store: Store, limit: int) -> list[dict[str, Any]]:
    """The newest drained / held / released / switched events of every deployment."""
    if not store.path.exists():
        return []
    kinds = ", ".join(f"'{k}'" for k in CHANGE_EVENTS)
    try:
        with store.connect(write=False) as conn:
            rows = conn.execute(f"SELECT name, time, kind, message FROM events WHERE kind IN ({kinds}) "
                                "ORDER BY id DESC LIMIT ?", (limit,)).fetchall()  # fmt: skip
    except sqlite3.Error:
        return []
    return [dict(r) for r in rows]
