"""The outcome of scoring one answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """Pass or fail, and why (one short line a user can act on)."""

    passed: bool
    why: str

    @staticmethod
    def ok(why: str = "ok") -> Verdict:
        return Verdict(True, why)

    @staticmethod
    def fail(why: str) -> Verdict:
        return Verdict(False, why)
