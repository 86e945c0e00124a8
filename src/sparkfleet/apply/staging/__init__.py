"""Staging, controller side: how each kind runs (one module per kind, named as its module in
``plan/staging/``, each listed once in ``RUNNERS``) and the phase that runs them (``phase.py``).
What runs on a node is in ``sparkfleet.nodes`` (commands, and the shipped workers)."""

from __future__ import annotations

from sparkfleet.apply.staging import composed, copy, hub, nfs, sparse_rows, sync
from sparkfleet.apply.staging.base import Runner
from sparkfleet.plan.staging import Entry

RUNNERS: dict[type[Entry], Runner] = {
    r.entry: r for r in (sparse_rows.RUNNER, sync.RUNNER, copy.RUNNER, nfs.RUNNER, composed.RUNNER, hub.RUNNER)
}
