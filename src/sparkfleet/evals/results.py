"""Quality-run results: per task and per run, with the summaries a user reads."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sparkfleet.evals.checks import CATEGORIES

CONTENT_KEEP = 4000  # characters of each answer kept in the stored result, for audit


@dataclass(frozen=True)
class TaskResult:
    """One task's outcome."""

    id: str
    category: str
    passed: bool
    why: str
    thinking: bool
    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int | None
    seconds: float
    reasoning_chars: int
    content: str

    @property
    def tok_s(self) -> float | None:
        if not self.completion_tokens or self.seconds <= 0:
            return None
        return self.completion_tokens / self.seconds


@dataclass(frozen=True)
class QualityRun:
    """A whole quality run and how it was made."""

    id: str
    label: str
    endpoint: str
    model: str
    engine: str
    api: str
    prompt_format: str
    thinking_control: str
    sandbox: str
    started_utc: str
    wall_s: float
    results: tuple[TaskResult, ...]

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def truncated(self) -> int:
        """Answers cut off by the token budget (finish_reason "length")."""
        return sum(r.finish_reason == "length" for r in self.results)

    def by_category(self) -> dict[str, tuple[int, int]]:
        """category -> (passed, total), in the canonical category order."""
        out: dict[str, tuple[int, int]] = {}
        for cat in CATEGORIES:
            rows = [r for r in self.results if r.category == cat]
            if rows:
                out[cat] = (sum(r.passed for r in rows), len(rows))
        return out

    def median_tok_s(self) -> float | None:
        rates = [r.tok_s for r in self.results if r.tok_s]
        return statistics.median(rates) if rates else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["results"] = [asdict(r) for r in self.results]
        data["summary"] = {
            "passed": self.passed,
            "total": self.total,
            "truncated": self.truncated,
            "median_tok_s": self.median_tok_s(),
            "by_category": {k: list(v) for k, v in self.by_category().items()},
        }
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QualityRun:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "results"}
        results = tuple(
            TaskResult(**{k: v for k, v in r.items() if k in TaskResult.__dataclass_fields__})
            for r in data.get("results", [])
        )
        return cls(**fields, results=results)
