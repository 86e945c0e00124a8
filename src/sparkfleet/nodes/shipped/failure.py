"""The one exception the node-side staging code raises, and how a worker reports a failure:
shipped code cannot import ``sparkfleet.errors``, so the controller turns a reported failure into
a ``StagingError`` that names the node."""

from __future__ import annotations

from typing import Any


class StageFailure(Exception):
    """Staging cannot proceed on this node; the message is shown to the user as-is."""


def failure_result(exc: Exception) -> dict[str, Any]:
    """A worker's ``{"ok": False, "error": …}`` for an expected failure."""
    if isinstance(exc, StageFailure):
        return {"ok": False, "error": str(exc)}
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return {"ok": False, "error": f"{where}{exc.strerror or exc}"}
    return {"ok": False, "error": f"bad staging worker arguments: {exc!r}"}
