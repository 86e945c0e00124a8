"""The staging kinds: one module per kind in this package, each listed once in ``KINDS``.

A kind's module holds its entry (the keys a recipe writes, validated), what it lacks without a
cluster (``problem``), the steps it plans per node and what it adds to the ranks' mounts; how it
runs is the module of the same name in ``apply/staging/``. ``StagingEntry`` is the union of the
kinds a ``[[staging]]`` table may name, told apart by ``kind``.
"""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from sparkfleet.plan.staging.base import Entry, Planning, StagingStep
from sparkfleet.plan.staging.composed import Composed
from sparkfleet.plan.staging.copy import Copy
from sparkfleet.plan.staging.hub import Hub
from sparkfleet.plan.staging.nfs import Nfs
from sparkfleet.plan.staging.sparse_rows import SparseRows
from sparkfleet.plan.staging.sync import Sync

__all__ = ["BY_KIND", "KINDS", "Entry", "Planning", "StagingEntry", "StagingStep", "entry_from"]

KINDS: tuple[type[Entry], ...] = (SparseRows, Sync, Copy, Nfs, Composed, Hub)
BY_KIND: dict[str, type[Entry]] = {k.model_fields["kind"].default: k for k in KINDS}

if TYPE_CHECKING:
    StagingEntry = Entry
else:
    StagingEntry = Annotated[functools.reduce(operator.or_, (k for k in KINDS if k.written)),
                             Field(discriminator="kind")]  # fmt: skip


def entry_from(data: dict[str, Any]) -> Entry:
    """An entry of any kind from its JSON (a stored Plan)."""
    return BY_KIND[data["kind"]].model_validate(data)
