"""The exact two-sided McNemar test on paired pass/fail outcomes."""

from __future__ import annotations

from math import comb


def mcnemar_exact(broke: int, fixed: int) -> float:
    """Two-sided exact p for ``broke`` A-pass/B-fail and ``fixed`` A-fail/B-pass discordant pairs.

    Under the null hypothesis each discordant pair is a fair coin, so the smaller count is
    Binomial(n, 1/2); p = 2·P(X ≤ min), capped at 1. No flips gives p = 1.
    """
    if broke < 0 or fixed < 0:
        raise ValueError("counts must be non-negative")
    n = broke + fixed
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(broke, fixed) + 1)) / 2**n
    return min(1.0, 2.0 * tail)
