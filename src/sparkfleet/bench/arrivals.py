"""When an open-loop benchmark sends its requests: Poisson, gamma (burstiness) or constant arrivals.

The process is ``vllm bench serve``'s: inter-arrival gaps drawn from a gamma distribution with
shape ``burstiness`` and mean ``1 / rate`` (burstiness 1 is a Poisson process; below 1 burstier,
above 1 more even; ``inf`` is a constant gap), drawn with numpy's legacy generator seeded with
``seed``, then, for a fixed number of requests, rescaled so the last arrival falls at exactly
``n / rate`` — the same normalisation vLLM applies so that one seed's sum of gaps does not move
the achieved rate by the 1–2 % a finite sample wanders. With the same seed the schedule equals
vLLM's, which is what lets the agreement benchmark send both tools the same workload.

A duration-bounded run draws gaps until ``duration`` and does not rescale. A rate of ``inf``
sends everything at once (a concurrency cap then paces it, closed loop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sparkfleet.errors import BenchError

INF = math.inf


@dataclass(frozen=True)
class Arrivals:
    """How requests arrive: ``rate`` requests per second (``inf``: all at once), gap shape."""

    rate: float
    burstiness: float = 1.0  # gamma shape; 1 = Poisson, inf = constant gaps

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise BenchError(f"--request-rate must be positive or inf, not {self.rate:g}")
        if not self.burstiness > 0:
            raise BenchError(f"--burstiness must be positive (1 = Poisson, inf = constant), not {self.burstiness:g}")

    @property
    def process(self) -> str:
        """``poisson``, ``gamma(k=…)``, ``constant`` or ``burst`` (rate inf), for reports."""
        if self.rate == INF:
            return "burst"
        if self.burstiness == INF:
            return "constant"
        return "poisson" if self.burstiness == 1.0 else f"gamma(k={self.burstiness:g})"

    def gaps(self, rng: np.random.RandomState, count: int) -> list[float]:
        """``count`` inter-arrival gaps in seconds."""
        if self.rate == INF:
            return [0.0] * count
        if self.burstiness == INF:
            return [1.0 / self.rate] * count
        theta = 1.0 / (self.rate * self.burstiness)
        return [float(rng.gamma(shape=self.burstiness, scale=theta)) for _ in range(count)]


def schedule(arrivals: Arrivals, count: int, seed: int = 0) -> list[float]:
    """Send offsets (seconds from the tier's start) of ``count`` requests, normalised as vLLM does."""
    if count < 1:
        return []
    rng = np.random.RandomState(seed)
    offsets = list(np.cumsum(arrivals.gaps(rng, count)))
    if arrivals.rate != INF and offsets[-1] > 0:
        scale = (count / arrivals.rate) / offsets[-1]
        offsets = [t * scale for t in offsets]
    return [float(t) for t in offsets]


def schedule_for(arrivals: Arrivals, duration: float, seed: int = 0, limit: int = 1_000_000) -> list[float]:
    """Send offsets of every arrival before ``duration`` seconds (no rescaling: the count is random)."""
    if arrivals.rate == INF:
        raise BenchError("--duration with --request-rate inf needs --max-concurrency (else every request is sent at 0)")
    rng = np.random.RandomState(seed)
    out: list[float] = []
    now = 0.0
    while len(out) < limit:
        now += arrivals.gaps(rng, 1)[0]
        if now >= duration:
            break
        out.append(now)
    return out


def parse_burstiness(text: str, constant: bool = False) -> float:
    """A gamma shape, or ``inf`` for constant gaps (also with ``constant``)."""
    try:
        value = math.inf if constant or text.strip().lower() in ("inf", "constant") else float(text)
    except ValueError:
        raise BenchError(f"bad --burstiness {text!r}: a positive number (1 = Poisson) or inf (constant)") from None
    if not value > 0:
        raise BenchError(f"bad --burstiness {text!r}: a positive number (1 = Poisson) or inf (constant)")
    return value


def parse_rates(text: str) -> tuple[float, ...]:
    """``1,2,4,inf`` → rates in requests/s; one clear line naming ``--request-rate`` otherwise."""
    out: list[float] = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        try:
            value = INF if part in ("inf", "infinity") else float(part)
        except ValueError:
            raise BenchError(f"bad --request-rate {part!r}: give requests/s, comma-separated, e.g. 1,2,4,inf") from None
        if not value > 0 or math.isnan(value):
            raise BenchError(f"bad --request-rate {part!r}: rates must be positive (or inf)")
        out.append(value)
    if not out:
        raise BenchError("no --request-rate given")
    return tuple(out)


def rate_label(rate: float) -> str:
    """``2/s``, ``0.5/s``, ``inf/s``: the stored tier name of a rate."""
    return "inf/s" if rate == INF else f"{rate:g}/s"


def rate_of_label(tier: str) -> float:
    """Inverse of ``rate_label``."""
    head = tier.split("/", 1)[0]
    return INF if head == "inf" else float(head)
