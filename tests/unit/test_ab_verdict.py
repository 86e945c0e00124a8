"""The A/B verdict rule on known numbers: a 2× difference is named, noise is not, the rule's
floors hold, quality flips get the exact McNemar p."""

from __future__ import annotations

from sparkfleet.experiments.verdict import metric_verdict, quality_verdict

A = [[100.0, 101.0, 99.0], [98.0, 100.0, 102.0], [101.0, 99.5, 100.5]]


def test_twice_the_speed_is_named_with_its_interval() -> None:
    v = metric_verdict("decode tok/s", "tok/s", True, A, [[2 * x for x in r] for r in A])
    assert v.better == "b" and round(v.diff_pct) == 100 and v.low > 1.9 and v.high < 2.1


def test_slower_is_named_for_the_other_side_and_lower_is_better_flips_it() -> None:
    assert metric_verdict("tok/s", "tok/s", True, A, [[x / 2 for x in r] for r in A]).better == "a"
    assert metric_verdict("TTFT", "ms", False, A, [[x / 2 for x in r] for r in A]).better == "b"


def test_noise_and_a_small_but_consistent_shift_are_no_difference() -> None:
    same = [[99.0, 100.0, 101.5], [100.5, 98.5, 101.0], [100.0, 100.0, 99.0]]
    assert metric_verdict("tok/s", "tok/s", True, A, same).better is None
    shifted = [[x * 1.03 for x in r] for r in A]  # beyond the interval, under the 5 % minimum effect
    v = metric_verdict("tok/s", "tok/s", True, A, shifted)
    assert v.low > 1.0 and v.better is None


def test_overlapping_rounds_give_no_verdict_even_when_the_means_differ() -> None:
    b = [[130.0, 131.0, 129.0], [80.0, 82.0, 81.0], [120.0, 119.0, 121.0]]  # one round the other way
    v = metric_verdict("tok/s", "tok/s", True, A, b)
    assert v.low < 1.0 < v.high and v.better is None


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
