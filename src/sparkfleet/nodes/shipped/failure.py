"""The one exception the node-side staging code raises: shipped code cannot import
``sparkfleet.errors``, so the controller turns a reported ``StageFailure`` into a ``StagingError``."""

from __future__ import annotations


class StageFailure(Exception):
    """Staging cannot proceed on this node; the message is shown to the user as-is."""
