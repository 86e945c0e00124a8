"""Prose tasks: degeneration only (length, no heading, exotic glyphs, verbatim repeats).

Prose is not graded for content; these checks catch a broken model — loops, garbage glyphs,
an answer cut short or run away — which is what a lossless speed change must not cause.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sparkfleet.evals.extract import without_code, words
from sparkfleet.evals.verdict import Verdict

EXOTIC_CODEPOINT = 0x2100
EXOTIC_MAX_RATIO = 0.02
REPEAT_MAX_RATIO = 0.05
REPEAT_MAX_ABS = 2


def validate(spec: Mapping[str, Any]) -> None:
    """``min_words`` and ``max_words``: 0 < min < max."""
    lo, hi = spec.get("min_words"), spec.get("max_words")
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 < lo < hi):
        raise ValueError("prose check needs integers 0 < min_words < max_words")


def repeated_ngrams(tokens: list[str], n: int) -> int:
    """How many n-gram occurrences repeat an earlier identical n-gram."""
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        if gram in seen:
            repeats += 1
        seen.add(gram)
    return repeats


def score(spec: Mapping[str, Any], answer: str) -> Verdict:
    """Pass unless the text is out of length range, has a heading, odd glyphs or loops."""
    # Plain prose was asked for: a program (say, one that holds a story in a string) is not prose.
    text = without_code(answer).strip()
    ws = words(text)
    if not spec["min_words"] <= len(ws) <= spec["max_words"]:
        outside = " outside code" if text != answer.strip() else ""
        return Verdict.fail(f"{len(ws)} words{outside}, expected {spec['min_words']}-{spec['max_words']}")
    if re.search(r"^\s{0,3}#{1,6}\s", text, re.MULTILINE):
        return Verdict.fail("has a markdown heading")
    letters = [ch for ch in text if not ch.isspace()]
    exotic = sum(1 for ch in letters if ord(ch) > EXOTIC_CODEPOINT)
    if letters and exotic / len(letters) > EXOTIC_MAX_RATIO:
        return Verdict.fail(f"{exotic} exotic glyphs ({exotic / len(letters):.1%})")
    lowered = [re.sub(r"[^\w']", "", w.lower()) for w in ws]
    for n in (4, 6):
        grams = max(1, len(lowered) - n + 1)
        rep = repeated_ngrams(lowered, n)
        if rep > max(REPEAT_MAX_ABS, REPEAT_MAX_RATIO * grams):
            return Verdict.fail(f"{rep} repeated {n}-grams (loop)")
    return Verdict.ok(f"{len(ws)} words, no degeneration")
