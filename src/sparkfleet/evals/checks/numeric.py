"""Math and reasoning tasks: a final number within a tolerance, or one word out of options.

Both are read from what the model said: a literal in its code (fenced, inline or a bare
program) is not an answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sparkfleet.evals.extract import extract_final_number, without_code
from sparkfleet.evals.verdict import Verdict


def validate(spec: Mapping[str, Any]) -> None:
    """Either ``answer`` (number, optional ``tol``) or ``word`` with ``options`` that include it."""
    if "answer" in spec:
        if isinstance(spec["answer"], bool) or not isinstance(spec["answer"], int | float):
            raise ValueError("'answer' must be a number")
        tol = spec.get("tol", 0.01)
        if not isinstance(tol, int | float) or tol < 0:
            raise ValueError("'tol' must be a non-negative number")
        return
    if "word" in spec:
        options = spec.get("options")
        if not isinstance(options, list) or len(options) < 2:
            raise ValueError("'word' needs 'options', a list of at least two candidate words")
        if str(spec["word"]).lower() not in [str(o).lower() for o in options]:
            raise ValueError("'word' must be one of 'options'")
        return
    raise ValueError("needs 'answer' (a number) or 'word' (with 'options')")


def _last_option(answer: str, options: list[str]) -> str | None:
    best, best_pos = None, -1
    for opt in options:
        for m in re.finditer(rf"\b{re.escape(opt)}\b", answer, re.IGNORECASE):
            if m.start() > best_pos:
                best, best_pos = opt, m.start()
    return best


def score(spec: Mapping[str, Any], answer: str) -> Verdict:
    """A number within tol of the answer, or the last option named is the expected word."""
    if "word" in spec:
        # The last option mentioned is the conclusion; listing every option does not pass.
        said = _last_option(without_code(answer), [str(o) for o in spec["options"]])
        if said is None:
            return Verdict.fail("none of the options named")
        if said.lower() == str(spec["word"]).lower():
            return Verdict.ok(f"answered {said}")
        return Verdict.fail(f"answered {said}, expected {spec['word']}")
    expected = float(spec["answer"])
    got = extract_final_number(answer)
    if got is None:
        return Verdict.fail("no number in the answer")
    if abs(got - expected) <= float(spec.get("tol", 0.01)):
        return Verdict.ok(f"answered {got:g}")
    return Verdict.fail(f"answered {got:g}, expected {expected:g}")
