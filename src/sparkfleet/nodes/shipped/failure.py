"""The one exception the node-side staging code raises.

The node-side modules of this package are shipped to nodes as a single stdlib-only script (see
``bundle.py``), so they cannot raise ``sparkfleet.errors`` types; the controller turns a
``StageFailure`` reported by the script into a ``StagingError`` that names the node.
"""

from __future__ import annotations


class StageFailure(Exception):
    """Staging cannot proceed on this node; the message is shown to the user as-is."""
