"""The stored bench run's lifecycle that `sparkfleet bench` and `ab` share (bench/runs.py): a run
that finishes is complete; one cut short is partial, saying why, with what was stored kept; one
cut short before it measured anything is not kept (no empty "partial" run per failed attempt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfleet.bench.decode import DecodeConfig
from sparkfleet.bench.endpoint import Endpoint
from sparkfleet.bench.runs import create_run, run_stored
from sparkfleet.bench.store import BenchStore
from sparkfleet.errors import BenchError
from sparkfleet.state.store import Store

ENDPOINT = Endpoint("http://127.0.0.1:9", "org/m", "vllm", "0.9", "dep")


def _cut(exc: BaseException, bench: BenchStore | None = None, run_id: int = 0):  # type: ignore[no-untyped-def]
    def work() -> None:
        if bench is not None:  # one tier measured before the cut
            bench.add_sample(run_id, "prose/c1", 0, {"steady_tps": 1.0}, ())
        raise exc

    return work


@pytest.mark.parametrize(
    ("exc", "note"),
    [(KeyboardInterrupt(), "interrupted by the user"), (BenchError("endpoint went away"), "endpoint went away")],
    ids=["ctrl-c", "bench-error"],
)
def test_a_run_cut_short_is_partial_and_says_why(tmp_path: Path, exc: BaseException, note: str) -> None:
    bench = BenchStore(Store(tmp_path / "state.db"))
    run_id = create_run(bench, "decode", ENDPOINT, DecodeConfig(), "a label")
    with pytest.raises(type(exc)):
        run_stored(bench, run_id, _cut(exc, bench, run_id))
    run = bench.get_run(run_id)
    assert (run.status, run.note, run.label, run.deployment) == ("partial", note, "a label", "dep")
    assert len(bench.samples(run_id)) == 1


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), BenchError("reports no token usage")], ids=["ctrl-c", "error"])
def test_a_run_that_measured_nothing_is_not_kept(tmp_path: Path, exc: BaseException) -> None:
    bench = BenchStore(Store(tmp_path / "state.db"))
    run_id = create_run(bench, "decode", ENDPOINT, DecodeConfig(), "a label")
    with pytest.raises(type(exc)):
        run_stored(bench, run_id, _cut(exc))
    assert bench.list_runs() == [] and not bench.has_run(run_id)


def test_a_run_that_finishes_is_complete(tmp_path: Path) -> None:
    bench = BenchStore(Store(tmp_path / "state.db"))
    run_id = create_run(bench, "decode", ENDPOINT, DecodeConfig(), None)
    assert run_stored(bench, run_id, lambda: 7) == 7
    assert bench.get_run(run_id).status == "complete"
