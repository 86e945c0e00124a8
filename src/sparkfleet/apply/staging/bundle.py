"""The staging worker: the node-side staging modules as one stdlib-only script.

Nodes do not have sparkfleet installed. ``sparkfleet.nodes.ship`` joins the modules of
``STAGE_WORKER`` (``nodes/shipped/``) in dependency order, dropping their imports of each other,
so the names are the same as in the package; this module names that script for staging.
"""

from __future__ import annotations

from sparkfleet.nodes.ship import STAGE_WORKER, program_text

# Dependency order: each module uses only names from the ones before it.
NODE_MODULES = STAGE_WORKER.modules


def worker_source() -> bytes:
    """The staging worker script (what ``run_shipped`` sends; ``python3 - '<json>'`` with it on
    stdin runs it too)."""
    return program_text(STAGE_WORKER).encode()
