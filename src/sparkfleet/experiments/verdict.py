"""The A/B verdict arithmetic: pure functions over per-round measurements.

Rule (stated in every report): the rounds are the unit of evidence. Each round runs both
variants back to back (in alternating order), so what drifts between rounds — another job, a
warm page cache, thermal state — moves both of that round's values; the round's ratio B/A of
its repeat means cancels it. The 95 % interval of the ratio is Student's t over the rounds' log
ratios (n − 1 degrees of freedom): with few rounds it is wide, as it must be — a resampling
bootstrap over two rounds claims a precision two numbers cannot give, and called an identical
pair different on a loaded machine. One round gives no interval and no verdict. A variant is
better when the whole interval lies on its side of 1 *and* the point ratio differs from 1 by at
least the minimum effect (5 % by default) — and, for times, by at least an absolute floor (5 ms,
1 s) that a timer's jitter cannot reach; otherwise there is no difference. Quality: tasks paired
between the variants (a task's outcome is its majority over rounds), flips tested with the exact
McNemar p; a difference needs p < 0.05.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean, stdev

from sparkfleet.evals.mcnemar import mcnemar_exact

MIN_EFFECT = 0.05
# Absolute floors per unit: a 0.4 ms TTFT difference is 20 % of a stand-in's TTFT, and noise.
MIN_ABSOLUTE = {"ms": 5.0, "s": 1.0}
SIGNIFICANT = 0.05
# Student's t, two-sided 95 % (the 0.975 quantile), by degrees of freedom; beyond the table
# the quantile is within 0.5 % of the last entry's, and 1.96 in the limit.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)  # fmt: skip


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with df degrees of freedom."""
    if df < 1:
        raise ValueError("Student's t needs at least one degree of freedom")
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def rule_text(min_effect: float = MIN_EFFECT) -> str:
    """The verdict rule, as the report states it."""
    return (
        f"per metric: each round's ratio B/A of its repeat means (both variants ran back to back in it); "
        f"the 95% interval is Student's t over the rounds' log ratios (n-1 degrees of freedom; one round "
        f"gives no interval); a variant is better when the interval lies entirely on its side of 1 and the "
        f"difference is at least {min_effect:.0%} (and at least 5 ms for latencies, 1 s for time to ready); "
        f"otherwise no difference. Quality: paired tasks (majority over rounds), exact McNemar p < {SIGNIFICANT}"
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
    interval: tuple[float, float] | None  # None: one round, which cannot tell change from drift
    better: str | None  # "a", "b" or None (no difference)

    @property
    def diff_pct(self) -> float:
        return 100.0 * (self.ratio - 1.0)


def paired_ratio_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """The 95 % interval of B/A from round-paired means (a[i] and b[i] ran in round i)."""
    if len(a) != len(b):
        raise ValueError("both variants need the same rounds")
    if len(a) < 2:
        return None
    logs = [math.log(y / x) for x, y in zip(a, b, strict=True)]
    half = t975(len(logs) - 1) * stdev(logs) / math.sqrt(len(logs))
    return math.exp(fmean(logs) - half), math.exp(fmean(logs) + half)


def metric_verdict(name: str, unit: str, higher_is_better: bool, a: Sequence[Sequence[float]],
                   b: Sequence[Sequence[float]], min_effect: float = MIN_EFFECT) -> MetricVerdict:  # fmt: skip
    """The rule applied to one metric; a[i] and b[i] hold round i's repeat values."""
    if len(a) != len(b) or not a or any(not r for r in (*a, *b)):
        raise ValueError(f"{name}: both variants need a value in every round")
    a_rounds, b_rounds = tuple(tuple(r) for r in a), tuple(tuple(r) for r in b)
    a_mean = fmean(v for r in a_rounds for v in r)
    b_mean = fmean(v for r in b_rounds for v in r)
    ratio = b_mean / a_mean
    interval = paired_ratio_interval([fmean(r) for r in a_rounds], [fmean(r) for r in b_rounds])
    better = None
    if interval is not None and abs(b_mean - a_mean) >= MIN_ABSOLUTE.get(unit, 0.0):
        low, high = interval
        b_up = low > 1.0 and ratio - 1.0 >= min_effect
        b_down = high < 1.0 and 1.0 - ratio >= min_effect
        if b_up or b_down:
            better = "b" if b_up == higher_is_better else "a"
    return MetricVerdict(name, unit, higher_is_better, a_rounds, b_rounds, a_mean, b_mean, ratio, interval, better)


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
