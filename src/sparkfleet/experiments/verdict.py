"""The A/B verdict arithmetic: pure functions over per-round measurements.

Rule (stated in every report): for each metric, the 95 % interval of the ratio B/A of the means
comes from a two-level bootstrap — rounds resampled with replacement, then each drawn round's
repeats — with a fixed seed, so one set of numbers always gives one verdict. A variant is better
when the whole interval lies on its side of 1 *and* the point ratio differs from 1 by at least
the minimum effect (5 % by default) — and, for times, by at least an absolute floor (5 ms, 1 s)
that a timer's jitter cannot reach; otherwise there is no difference. Quality: tasks paired
between the variants (a task's outcome is its majority over rounds), flips tested with the exact
McNemar p; a difference needs p < 0.05.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean

from sparkfleet.evals.mcnemar import mcnemar_exact

RESAMPLES = 2000
SEED = 0
MIN_EFFECT = 0.05
# Absolute floors per unit: a 0.4 ms TTFT difference is 20 % of a stand-in's TTFT, and noise.
MIN_ABSOLUTE = {"ms": 5.0, "s": 1.0}
SIGNIFICANT = 0.05


def rule_text(min_effect: float = MIN_EFFECT) -> str:
    """The verdict rule, as the report states it."""
    return (
        f"per metric: 95% two-level bootstrap interval of B/A (rounds, then each round's repeats; "
        f"{RESAMPLES} resamples, seed {SEED}); a variant is better when the interval lies entirely on its "
        f"side of 1 and the difference is at least {min_effect:.0%} (and at least 5 ms for latencies, 1 s for "
        f"time to ready); otherwise no difference. Quality: "
        f"paired tasks (majority over rounds), exact McNemar p < {SIGNIFICANT}"
    )


@dataclass(frozen=True)
class MetricVerdict:
    """Both variants' values of one metric and what the rule says about them."""

    name: str
    unit: str
    higher_is_better: bool
    a_rounds: tuple[tuple[float, ...], ...]
    b_rounds: tuple[tuple[float, ...], ...]
    a_mean: float
    b_mean: float
    ratio: float
    low: float
    high: float
    better: str | None  # "a", "b" or None (no difference)

    @property
    def diff_pct(self) -> float:
        return 100.0 * (self.ratio - 1.0)


def _draw(rounds: Sequence[Sequence[float]], rng: random.Random) -> float:
    picked = [rounds[rng.randrange(len(rounds))] for _ in rounds]
    return fmean(r[rng.randrange(len(r))] for r in picked for _ in r)


def bootstrap_ratio(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]],
                    resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:  # fmt: skip
    """The 95 % two-level bootstrap interval of mean(B) / mean(A)."""
    rng = random.Random(seed)
    ratios = sorted(_draw(b, rng) / _draw(a, rng) for _ in range(resamples))
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def metric_verdict(name: str, unit: str, higher_is_better: bool, a: Sequence[Sequence[float]],
                   b: Sequence[Sequence[float]], min_effect: float = MIN_EFFECT) -> MetricVerdict:  # fmt: skip
    """The rule applied to one metric; a and b hold each round's repeat values."""
    a_rounds = tuple(tuple(r) for r in a if r)
    b_rounds = tuple(tuple(r) for r in b if r)
    if not a_rounds or not b_rounds:
        raise ValueError(f"{name}: both variants need at least one measured round")
    a_mean = fmean(v for r in a_rounds for v in r)
    b_mean = fmean(v for r in b_rounds for v in r)
    ratio = b_mean / a_mean
    low, high = bootstrap_ratio(a_rounds, b_rounds)
    large = abs(b_mean - a_mean) >= MIN_ABSOLUTE.get(unit, 0.0)
    b_up = large and low > 1.0 and ratio - 1.0 >= min_effect
    b_down = large and high < 1.0 and 1.0 - ratio >= min_effect
    better = None
    if b_up or b_down:
        better = "b" if b_up == higher_is_better else "a"
    return MetricVerdict(name, unit, higher_is_better, a_rounds, b_rounds, a_mean, b_mean, ratio, low, high, better)


@dataclass(frozen=True)
class QualityVerdict:
    """Paired quality outcomes of the two variants."""

    a_passed: int
    b_passed: int
    paired: int
    broke: int  # A passes, B fails
    fixed: int  # A fails, B passes
    p: float
    better: str | None


def _majority(rounds: Sequence[Mapping[str, bool]]) -> dict[str, bool]:
    tasks = set().union(*(r.keys() for r in rounds)) if rounds else set()
    return {t: 2 * sum(bool(r.get(t)) for r in rounds if t in r) > sum(t in r for r in rounds) for t in tasks}


def quality_verdict(a: Sequence[Mapping[str, bool]], b: Sequence[Mapping[str, bool]]) -> QualityVerdict:
    """a and b: per round, task id -> passed."""
    ma, mb = _majority(a), _majority(b)
    paired = sorted(ma.keys() & mb.keys())
    broke = sum(ma[t] and not mb[t] for t in paired)
    fixed = sum(mb[t] and not ma[t] for t in paired)
    p = mcnemar_exact(broke, fixed)
    better = None if p >= SIGNIFICANT else ("b" if fixed > broke else "a")
    return QualityVerdict(sum(ma[t] for t in paired), sum(mb[t] for t in paired), len(paired), broke, fixed, p, better)
