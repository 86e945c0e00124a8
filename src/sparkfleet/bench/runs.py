"""The stored bench run's lifecycle, one for every caller (``sparkfleet bench``, ``ab``): a run
is created with its endpoint and configuration, measured, then marked ``complete``, or
``partial`` with why when the measuring was cut short (Ctrl-C, a BenchError, anything else);
what was stored until then stays. A run cut short before it measured anything is not kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sparkfleet.bench.endpoint import Endpoint
from sparkfleet.bench.meta import run_meta
from sparkfleet.bench.store import BenchStore
from sparkfleet.errors import SparkfleetError

T = TypeVar("T")
INTERRUPTED = "interrupted by the user"


def create_run(bench: BenchStore, kind: str, endpoint: Endpoint, config: Any, label: str | None) -> int:
    """A new stored run of kind against endpoint; its id."""
    return bench.create_run(kind, endpoint.base_url, model=endpoint.model, engine=endpoint.engine,
                            engine_version=endpoint.engine_version, deployment=endpoint.deployment,
                            meta=run_meta(endpoint, config), label=label)  # fmt: skip


def run_stored(bench: BenchStore, run_id: int, work: Callable[[], T]) -> T:
    """Run work (which stores its samples under run_id); mark the run complete, or partial with
    why when work raised (then re-raise), or delete it when it raised before any sample."""
    try:
        result = work()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            why = INTERRUPTED
        else:
            why = exc.message if isinstance(exc, SparkfleetError) else str(exc) or type(exc).__name__
        if not bench.discard_if_empty(run_id):
            bench.finish_run(run_id, "partial", why)
        raise
    bench.finish_run(run_id, "complete")
    return result
