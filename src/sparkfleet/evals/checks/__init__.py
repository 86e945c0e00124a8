"""Checkers, one module per kind of answer; each has ``validate(spec)`` and ``score(spec, answer)``.

``validate`` runs when tasks load (a bad task file fails at once, naming the task), ``score``
judges the final answer text, reasoning already removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from sparkfleet.evals.checks import code, format_rules, jsondoc, numeric, prose
from sparkfleet.evals.sandbox import SandboxLimits
from sparkfleet.evals.verdict import Verdict

CATEGORIES = ("code", "json", "math", "reasoning", "format", "prose")
_BY_CATEGORY: dict[str, ModuleType] = {
    "code": code,
    "json": jsondoc,
    "math": numeric,
    "reasoning": numeric,
    "format": format_rules,
    "prose": prose,
}


def validate_check(category: str, spec: Mapping[str, Any]) -> None:
    """Raise ValueError when ``spec`` is not a valid check for the category."""
    if not isinstance(spec, Mapping):
        raise ValueError("must be a table")
    _BY_CATEGORY[category].validate(spec)


def score(category: str, spec: Mapping[str, Any], answer: str, *, limits: SandboxLimits | None = None) -> Verdict:
    """Judge an answer (reasoning already stripped) against the task's check."""
    if category == "code":
        return code.score(spec, answer, limits=limits)
    result: Verdict = _BY_CATEGORY[category].score(spec, answer)
    return result
