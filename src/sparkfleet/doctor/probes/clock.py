"""The node's wall clock: `date +%s.%N`, compared with the local clock around the call."""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.doctor.probes.fact import Fact, section

COMMAND = ["date", "+%s.%N"]


def parse(stdout: str) -> float:
    """Seconds since the epoch."""
    return float(stdout.strip())


@dataclass(frozen=True)
class Skew:
    """How far a node's clock is off ours; zero when it lies within the call's round trip."""

    seconds: float
    uncertainty: float


def skew(remote: float, sent: float, received: float) -> Skew:
    """Offset of `remote` from the local window [sent, received] during which it was read."""
    if remote < sent:
        offset = remote - sent
    elif remote > received:
        offset = remote - received
    else:
        offset = 0.0
    return Skew(seconds=offset, uncertainty=received - sent)


FACT = Fact(
    "skew",
    lambda _req: {"clock": COMMAND},
    lambda outs, asked: skew(parse(section(outs, "clock").stdout), asked.sent, asked.received),
)
