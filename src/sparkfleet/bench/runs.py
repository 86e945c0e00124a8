"""The stored bench run's lifecycle, one for every caller (``sparkfleet bench``, ``ab``): a run
is created with its endpoint and configuration, measured, then marked ``complete``, or
``partial`` with why when the measuring was cut short (Ctrl-C, a BenchError, anything else);
what was stored until then stays. A run cut short before it measured anything is not kept."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sparkfleet.bench.decode import DecodeConfig, DecodeTierRun, ExactLength, run_decode
from sparkfleet.bench.endpoint import Endpoint
from sparkfleet.bench.meta import run_meta
from sparkfleet.bench.prefill import PrefillConfig, PrefillPlan, PrefillRun, run_prefill
from sparkfleet.bench.progress import Progress
from sparkfleet.bench.serve import ServeBench, ServeConfig, ServeTierRun
from sparkfleet.bench.store import BenchStore
from sparkfleet.errors import SparkfleetError

T = TypeVar("T")
INTERRUPTED = "interrupted by the user"
Say = Callable[[str], None]


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


Measured = list[DecodeTierRun] | list[PrefillRun] | list[ServeTierRun]


def _quiet(_line: str) -> None:
    pass


def measure(bench: BenchStore, run_id: int, endpoint: Endpoint, config: DecodeConfig | PrefillConfig | ServeConfig,
            progress: Progress | None = None, warn: Say = _quiet, note: Say = _quiet) -> Measured:  # fmt: skip
    """Measure config (its type picks decode, prefill or serve) against endpoint as the stored run
    run_id (``run_stored``): each tier repeat is stored as it ends, what the run learns about the
    server (exact lengths, the prefill overhead and context) goes into its meta; ``warn`` gets
    each finding that makes a figure unclean, ``note`` each other one."""

    def exact_meta(exact: ExactLength, **more: Any) -> None:
        bench.update_meta(run_id, exact_length={"enforced": exact.enforced, "params": exact.params,
                                                "note": exact.note}, **more)  # fmt: skip
        if not exact.enforced:
            warn(exact.note)

    if isinstance(config, DecodeConfig):

        def decoded(run: DecodeTierRun) -> None:
            bench.add_sample(run_id, run.tier, run.repeat, run.stats, run.records)

        work: Coroutine[Any, Any, Measured] = run_decode(endpoint, config, progress, decoded, exact_meta)
    elif isinstance(config, PrefillConfig):

        def prefilled(run: PrefillRun) -> None:
            bench.add_sample(run_id, run.tier, run.repeat, run.sample, (run.record,))
            if run.sample.cached_tokens:
                warn(f"{run.sample.cached_tokens} of {run.sample.prompt_tokens} prompt tokens came from a cache "
                     f"at {run.length}: that rate is not a cold prefill")  # fmt: skip

        def overhead(seconds: float, plan: PrefillPlan) -> None:
            bench.update_meta(run_id, overhead_ms=seconds * 1000, lengths=plan.lengths, context=plan.context,
                              dropped=plan.dropped)  # fmt: skip
            if plan.dropped:
                note(f"lengths {', '.join(map(str, plan.dropped))} exceed the context of {plan.context} tokens; "
                     f"measuring up to {plan.lengths[-1]}")  # fmt: skip

        work = run_prefill(endpoint, config, progress, prefilled, overhead)
    else:

        def served(run: ServeTierRun) -> None:
            bench.add_sample(run_id, run.tier, run.repeat, run.stats, run.records)
            if run.foreign_requests:
                warn(f"tier {run.tier}: the engine ran {run.foreign_requests} requests beyond the bench's own "
                     "(foreign traffic in the window); its figures are not clean")  # fmt: skip

        def setup(exact: ExactLength, chars_per_token: float) -> None:
            exact_meta(exact, chars_per_token=chars_per_token)

        work = ServeBench(endpoint, config, progress).run(served, setup)
    return run_stored(bench, run_id, lambda: asyncio.run(work))
