"""The A/B verdict rule on known numbers: a 2× difference is named, noise is not (also the two
noisy rounds on which CI once called an identical pair different), one round decides nothing,
the rule's floors hold, quality flips get the exact McNemar p."""

from __future__ import annotations

import math
import random

import pytest

from sparkfleet.experiments.verdict import metric_verdict, quality_verdict

A = [[100.0, 101.0, 99.0], [98.0, 100.0, 102.0], [101.0, 99.5, 100.5]]


def test_twice_the_speed_is_named_with_its_interval() -> None:
    v = metric_verdict("decode tok/s", "tok/s", True, A, [[2 * x for x in r] for r in A])
    assert v.better == "b" and round(v.diff_pct) == 100 and v.interval is not None
    assert 1.9 < v.interval[0] <= 2.0 <= v.interval[1] < 2.1


def test_slower_is_named_for_the_other_side_and_lower_is_better_flips_it() -> None:
    assert metric_verdict("tok/s", "tok/s", True, A, [[x / 2 for x in r] for r in A]).better == "a"
    assert metric_verdict("TTFT", "ms", False, A, [[x / 2 for x in r] for r in A]).better == "b"


def test_noise_and_a_small_but_consistent_shift_are_no_difference() -> None:
    same = [[99.0, 100.0, 101.5], [100.5, 98.5, 101.0], [100.0, 100.0, 99.0]]
    assert metric_verdict("tok/s", "tok/s", True, A, same).better is None
    shifted = [[x * 1.03 for x in r] for r in A]  # beyond the interval, under the 5 % minimum effect
    v = metric_verdict("tok/s", "tok/s", True, A, shifted)
    assert v.interval is not None and v.interval[0] > 1.0 and v.better is None


def test_overlapping_rounds_give_no_verdict_even_when_the_means_differ() -> None:
    b = [[130.0, 131.0, 129.0], [80.0, 82.0, 81.0], [120.0, 119.0, 121.0]]  # one round the other way
    v = metric_verdict("tok/s", "tok/s", True, A, b)
    assert v.interval is not None and v.interval[0] < 1.0 < v.interval[1] and v.better is None


def test_two_noisy_rounds_of_an_identical_pair_are_no_difference() -> None:
    # CI's run of two-threads against itself on CPU llama.cpp (ABBA order): A's second round ran
    # while the machine was busy. A resampling bootstrap over these two rounds said "+13 %,
    # interval +2…+27 %, B is better"; the rounds' own ratios (1.02, 1.26) disagree too much.
    v = metric_verdict("quality median tok/s", "tok/s", True, [[29.41], [23.96]], [[30.04], [30.32]])
    assert v.better is None and v.interval is not None and v.interval[0] < 1.0 < v.interval[1]


def test_one_round_gives_no_interval_and_no_verdict() -> None:
    v = metric_verdict("decode tok/s", "tok/s", True, [[100.0, 101.0]], [[200.0, 202.0]])
    assert v.interval is None and v.better is None and round(v.diff_pct) == 100


@pytest.mark.parametrize("n", [2, 3, 5, 12])
def test_an_identical_pair_is_called_different_in_at_most_one_experiment_in_twenty(n: int) -> None:
    # 4000 simulated experiments of two identical variants whose round values scatter ±15 %
    # (lognormal): the 95 % interval must exclude 1 about 5 % of the time, whatever the rounds.
    rng = random.Random(n)
    excluded = verdicts = 0
    for _ in range(4000):
        a = [[100 * math.exp(rng.gauss(0, 0.15))] for _ in range(n)]
        b = [[100 * math.exp(rng.gauss(0, 0.15))] for _ in range(n)]
        v = metric_verdict("tok/s", "tok/s", True, a, b)
        assert v.interval is not None
        excluded += not v.interval[0] < 1.0 < v.interval[1]
        verdicts += v.better is not None
    assert 0.035 < excluded / 4000 < 0.065 and verdicts <= excluded


def test_rounds_are_paired_so_drift_shared_by_both_variants_cancels() -> None:
    # The machine gets slower each round, both variants alike; B is 20 % faster in every round.
    a = [[100.0], [70.0], [45.0], [30.0]]
    v = metric_verdict("tok/s", "tok/s", True, a, [[1.2 * r[0]] for r in a])
    assert v.better == "b" and v.interval is not None and v.interval[0] == pytest.approx(1.2)


def test_times_below_the_absolute_floor_are_no_difference() -> None:
    tiny = [[2.0, 2.1, 1.9]] * 3
    assert metric_verdict("TTFT", "ms", False, tiny, [[x * 2 for x in r] for r in tiny]).better is None
    assert metric_verdict("TTFT", "ms", False, [[20.0]] * 3, [[40.0]] * 3).better == "a"


def test_quality_flips_take_the_majority_over_rounds_and_the_exact_mcnemar_p() -> None:
    tasks = [f"t{i}" for i in range(12)]
    a = [{t: True for t in tasks}] * 3
    b = [{t: i >= 8 for i, t in enumerate(tasks)}] * 3  # 8 broke
    q = quality_verdict(a, b)
    assert (q.broke, q.fixed, q.paired) == (8, 0, 12)
    assert abs(q.p - 2 * 0.5**8) < 1e-12 and q.better == "a"
    one_flip = [{**a[0], "t0": False}, a[0], a[0]]  # a flip in one round of three: the majority holds
    assert quality_verdict(a, one_flip).broke == 0 and quality_verdict(a, one_flip).better is None
