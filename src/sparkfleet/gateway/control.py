"""The CLI's side of the gateway's admin endpoint: find the gateways of this state dir (each wrote
``gateways/PID.json``: its loopback admin URL and token, 0600) and ask them to drain a deployment
or release what they hold for it. No gateway: nothing to ask, and every call returns []."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sparkfleet.state.store import state_dir

log = logging.getLogger("sparkfleet.gateway")


@dataclass(frozen=True)
class Admin:
    url: str
    token: str
    pid: int
    file: Path


def gateways(state: Path | None = None) -> list[Admin]:
    """The gateways serving from this state dir; a file left by a gateway that is gone is removed."""
    folder = (state or state_dir()) / "gateways"
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            data = json.loads(path.read_text())
            admin = Admin(str(data["url"]), str(data["token"]), int(data["pid"]), path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if data.get("host", socket.gethostname()) != socket.gethostname():
            continue  # another machine's gateway (a shared state dir): its loopback is not ours
        try:
            os.kill(admin.pid, 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        except PermissionError:
            pass  # another user's process with that pid: let the request find out
        found.append(admin)
    return found


def _call(admin: Admin, method: str, path: str, body: dict[str, Any] | None, timeout: float) -> dict[str, Any] | None:
    try:
        answer = httpx.request(method, admin.url + path, json=body, timeout=httpx.Timeout(timeout, connect=2.0),
                               headers={"authorization": f"Bearer {admin.token}"}, trust_env=False)  # fmt: skip
    except httpx.HTTPError as exc:
        log.warning("gateway pid %d at %s did not answer %s: %s", admin.pid, admin.url, path, exc)
        return None
    if answer.status_code != 200:
        log.warning("gateway pid %d: %s answered %d", admin.pid, path, answer.status_code)
        return None
    result: dict[str, Any] = answer.json()
    return result


def drain(name: str, *, hold: bool, grace: float | None = None, state: Path | None = None) -> list[dict[str, Any]]:
    """Every gateway stops sending deployment name new requests and waits for its in-flight ones
    (up to grace, its own drain_grace without); what each reported."""
    body: dict[str, Any] = {"deployment": name, "hold": hold}
    if grace is not None:
        body["grace"] = grace
    wait = (grace if grace is not None else 600.0) + 30.0
    return [a for a in (_call(g, "POST", "/admin/drain", body, wait) for g in gateways(state)) if a is not None]


def release(name: str, since: float, state: Path | None = None) -> list[dict[str, Any]]:
    """Every gateway re-reads the state store now and lets go of what it held for name; how many
    requests each held since ``since`` (time.time()), released, turned away, and the longest wait."""
    body = {"deployment": name, "since": since}
    return [a for a in (_call(g, "POST", "/admin/release", body, 30.0) for g in gateways(state)) if a is not None]


def routes(state: Path | None = None) -> list[dict[str, Any]]:
    """Each gateway's routes: replicas, their requests in flight, draining, requests waiting."""
    return [a for a in (_call(g, "GET", "/admin/state", None, 5.0) for g in gateways(state)) if a is not None]
