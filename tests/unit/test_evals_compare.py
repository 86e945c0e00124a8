"""Exact McNemar and the paired comparison's flips, blocks and verdicts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkfleet.errors import EvalError
from sparkfleet.evals.compare import compare_runs
from sparkfleet.evals.mcnemar import mcnemar_exact
from sparkfleet.evals.results import QualityRun, TaskResult


def test_mcnemar_exact_known_values() -> None:
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(5, 0) == pytest.approx(0.0625)  # 2 * (1/2)^5
    assert mcnemar_exact(4, 0) == pytest.approx(0.125)
    assert mcnemar_exact(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert mcnemar_exact(2, 10) == mcnemar_exact(10, 2)


def _run(run_id: str, outcomes: dict[str, tuple[str, bool]]) -> QualityRun:
    results = tuple(
        TaskResult(tid, cat, ok, "ok" if ok else "wrong", False, "stop", 10, 5, 0.1, 0, "")
        for tid, (cat, ok) in outcomes.items()
    )
    return QualityRun(run_id, run_id, "http://x", "m", "e", "chat", "chat", "n/a", "ns", "t", 1.0, results)


BASE = {
    **{f"code_{i}": ("code", True) for i in range(10)},
    **{f"math_{i}": ("math", i % 2 == 0) for i in range(6)},
    **{f"json_{i}": ("json", True) for i in range(4)},
    **{f"prose_{i}": ("prose", True) for i in range(3)},
}


def test_a_run_against_itself_has_no_flips_and_p_one() -> None:
    run = _run("a", BASE)
    cmp = compare_runs(run, run)
    assert cmp.flips == ()
    assert all(b.p == 1.0 for b in cmp.blocks)
    assert not cmp.guard_tripped
    assert cmp.verdict.startswith("no difference")


def test_a_few_flips_either_way_are_noise() -> None:
    b = dict(BASE, code_0=("code", False), math_1=("math", True))
    cmp = compare_runs(_run("a", BASE), _run("b", b))
    assert {(f.id, f.direction) for f in cmp.flips} == {("code_0", "broke"), ("math_1", "fixed")}
    primary = next(x for x in cmp.blocks if x.name == "primary")
    assert (primary.broke, primary.fixed, primary.p) == (1, 1, 1.0)
    assert cmp.verdict.startswith("noise")


def test_many_breaks_are_not_noise() -> None:
    b = dict(BASE, **{f"code_{i}": ("code", False) for i in range(7)})
    cmp = compare_runs(_run("a", BASE), _run("b", b))
    primary = next(x for x in cmp.blocks if x.name == "primary")
    assert primary.broke == 7 and primary.p == pytest.approx(2 / 128)
    assert cmp.verdict.startswith("NOT NOISE: B is worse")


def test_one_broken_prose_task_trips_the_guard() -> None:
    b = dict(BASE, prose_1=("prose", False))
    cmp = compare_runs(_run("a", BASE), _run("b", b))
    assert cmp.guard_tripped
    assert "prose_1" in cmp.verdict and cmp.verdict.startswith("NOT NOISE")


def test_unpaired_tasks_are_listed_and_disjoint_runs_refused() -> None:
    b = {k: v for k, v in BASE.items() if k != "code_9"}
    cmp = compare_runs(_run("a", BASE), _run("b", b))
    assert cmp.only_in_a == ("code_9",) and cmp.paired == len(BASE) - 1
    with pytest.raises(EvalError, match="share no task ids"):
        compare_runs(_run("a", {"x": ("code", True)}), _run("b", {"y": ("code", True)}))


def test_results_round_trip_through_json() -> None:
    run = _run("a", BASE)
    again = QualityRun.from_json(run.to_json())
    assert again == run
    assert again.by_category()["math"] == (3, 6)
    assert replace(run, results=run.results[:1]).total == 1
