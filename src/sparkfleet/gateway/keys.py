"""API keys: ``sf-<id>-<secret>``; the database keeps the id (public, for lookup and for ``key
list``) and the SHA-256 of the secret. Keys are 256 random bits, so a fast hash is enough (no
password stretching); the comparison is constant-time.

The gateway looks a key up on every request (an indexed read, ~20 µs), so a revoke or a new key
takes effect on the next request without a restart."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from sparkfleet.errors import GatewayError
from sparkfleet.gateway import db

PREFIX = "sf"
_DUMMY = hashlib.sha256(b"no such key").digest()
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


@dataclass(frozen=True)
class Key:
    """A key as stored (never its secret)."""

    id: str
    name: str
    models: tuple[str, ...] | None  # None: every model
    rpm: int | None
    tpm: int | None
    expires: float | None
    created: float
    revoked: float | None

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    def state(self, now: float) -> str:
        if self.revoked:
            return "revoked"
        if self.expires is not None and now >= self.expires:
            return "expired"
        return "active"


def _duration(text: str) -> float | None:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text.strip())
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)] if m else None


def _moment(text: str, option: str) -> float:
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise GatewayError(f"{option} {text!r}: expected a duration (30d, 12h) or a date (2027-01-31)") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def parse_expiry(text: str, now: float) -> float:
    """``--expires``: a duration (``90m``, ``12h``, ``30d``, ``2w``) or an ISO date/time (UTC when no
    zone is given), as a Unix time in the future."""
    seconds = _duration(text)
    stamp = now + seconds if seconds is not None else _moment(text, "--expires")
    if stamp <= now:
        raise GatewayError(f"--expires {text!r}: that is in the past")
    return stamp


def parse_since(text: str, now: float) -> float:
    """``gateway log --since``: how far back (a duration) or from when (an ISO date/time, UTC
    when no zone is given), as a Unix time."""
    seconds = _duration(text)
    return now - seconds if seconds is not None else _moment(text, "--since")


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def _row(row: sqlite3.Row) -> Key:
    return Key(id=row["id"], name=row["name"], models=tuple(json.loads(row["models"])) if row["models"] else None,
               rpm=row["rpm"], tpm=row["tpm"], expires=row["expires"], created=row["created"],
               revoked=row["revoked"])  # fmt: skip


class KeyStore:
    """The keys table. One connection, reused (the gateway reads through it on every request)."""

    def __init__(self, conn: sqlite3.Connection | None = None) -> None:
        self.conn = conn or db.connect()

    def create(self, name: str, models: tuple[str, ...] | None, rpm: int | None, tpm: int | None,
               expires: float | None) -> tuple[Key, str]:  # fmt: skip
        """A new key; returns it and its value (shown once, stored only as a hash)."""
        if not _NAME.match(name):
            raise GatewayError(f"key name {name!r}: use 1-64 letters, digits, '.', '_', '-' or '@'")
        for what, value in (("--rpm", rpm), ("--tpm", tpm)):
            if value is not None and value <= 0:
                raise GatewayError(f"{what} {value}: must be a positive number")
        now = time.time()
        if any(k.name == name and k.state(now) == "active" for k in self.all()):
            raise GatewayError(f"a key named {name!r} is already active: revoke it first or pick another name")
        key_id = secrets.token_hex(4)
        secret = secrets.token_urlsafe(32)
        self.conn.execute(
            "INSERT INTO keys (id, name, hash, models, rpm, tpm, expires, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (key_id, name, _digest(secret), json.dumps(list(models)) if models else None, rpm, tpm, expires, now),
        )
        return Key(key_id, name, models or None, rpm, tpm, expires, now, None), f"{PREFIX}-{key_id}-{secret}"

    def all(self) -> list[Key]:
        return [_row(r) for r in self.conn.execute("SELECT * FROM keys ORDER BY created")]

    def any_active(self) -> bool:
        now = time.time()
        return self.conn.execute("SELECT 1 FROM keys WHERE revoked IS NULL AND (expires IS NULL OR expires > ?)"
                                 " LIMIT 1", (now,)).fetchone() is not None  # fmt: skip

    def revoke(self, name_or_id: str) -> list[Key]:
        """Revoke the active keys with this name (or this id); the ones revoked."""
        now = time.time()
        hits = [k for k in self.all() if name_or_id in (k.name, k.id) and k.state(now) == "active"]
        if not hits:
            raise GatewayError(f"no active key named {name_or_id!r} (see `sparkfleet gateway key list`)")
        self.conn.executemany("UPDATE keys SET revoked = ? WHERE id = ?", [(now, k.id) for k in hits])
        return hits

    def verify(self, presented: str) -> Key | None:
        """The active key whose value this is, or None. The work done is the same whether or not
        the id exists, and the hash comparison is constant-time."""
        parts = presented.split("-", 2)
        key_id, secret = (parts[1], parts[2]) if len(parts) == 3 and parts[0] == PREFIX else ("", presented)
        row = self.conn.execute("SELECT * FROM keys WHERE id = ?", (key_id,)).fetchone() if key_id else None
        stored = row["hash"] if row else _DUMMY
        if not hmac.compare_digest(stored, _digest(secret)) or row is None:
            return None
        key = _row(row)
        return key if key.state(time.time()) == "active" else None
