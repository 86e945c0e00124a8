"""Format tasks: exact, countable constraints on the shape of the answer.

``rules`` is a list of tables, each ``{rule = NAME, …}``; every rule must hold. Counting rules
take ``n`` (exact) or ``min``/``max``. Text rules take ``text`` (and ``ignore_case``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from sparkfleet.evals.extract import words
from sparkfleet.evals.verdict import Verdict

_BULLET = re.compile(r"^\s*[-*•]\s+\S")
_NUMBERED = re.compile(r"^\s*(\d+)[.)]\s+\S")
_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def _count_problem(name: str, got: int, rule: Mapping[str, Any]) -> str | None:
    if "n" in rule and got != rule["n"]:
        return f"{got} {name}, expected exactly {rule['n']}"
    if "min" in rule and got < rule["min"]:
        return f"{got} {name}, expected at least {rule['min']}"
    if "max" in rule and got > rule["max"]:
        return f"{got} {name}, expected at most {rule['max']}"
    return None


def _fold(text: str, rule: Mapping[str, Any]) -> str:
    return text.lower() if rule.get("ignore_case") else text


def _line_count(text: str, rule: Mapping[str, Any]) -> str | None:
    return _count_problem("lines", len(_lines(text)), rule)


def _bullets(text: str, rule: Mapping[str, Any]) -> str | None:
    lines = _lines(text)
    bullets = [ln for ln in lines if _BULLET.match(ln)]
    if rule.get("only") and len(bullets) != len(lines):
        return f"{len(lines) - len(bullets)} non-bullet lines"
    return _count_problem("bullets", len(bullets), rule)


def _numbered(text: str, rule: Mapping[str, Any]) -> str | None:
    nums = [int(m.group(1)) for ln in _lines(text) if (m := _NUMBERED.match(ln))]
    if nums != list(range(1, len(nums) + 1)):
        return f"numbering is {nums}, expected 1..{len(nums)}"
    return _count_problem("numbered items", len(nums), rule)


def _word_count(text: str, rule: Mapping[str, Any]) -> str | None:
    return _count_problem("words", len(words(text)), rule)


def _sentence_count(text: str, rule: Mapping[str, Any]) -> str | None:
    flat = " ".join(text.split())
    count = len(_SENTENCE_END.findall(flat))
    if flat and not _SENTENCE_END.search(flat[-3:]):
        count += 1  # a trailing sentence without final punctuation still counts
    return _count_problem("sentences", count, rule)


def _all_caps(text: str, rule: Mapping[str, Any]) -> str | None:
    lower = [ch for ch in text if ch.isalpha() and not ch.isupper()]
    return f"{len(lower)} lowercase letters" if lower else None


def _all_lower(text: str, rule: Mapping[str, Any]) -> str | None:
    upper = [ch for ch in text if ch.isalpha() and not ch.islower()]
    return f"{len(upper)} uppercase letters" if upper else None


def _starts_with(text: str, rule: Mapping[str, Any]) -> str | None:
    ok = _fold(text, rule).startswith(_fold(rule["text"], rule))
    return None if ok else f"does not start with {rule['text']!r}"


def _ends_with(text: str, rule: Mapping[str, Any]) -> str | None:
    ok = _fold(text, rule).endswith(_fold(rule["text"], rule))
    return None if ok else f"does not end with {rule['text']!r}"


def _exact(text: str, rule: Mapping[str, Any]) -> str | None:
    ok = _fold(text, rule) == _fold(rule["text"], rule)
    return None if ok else f"is {text[:60]!r}, expected exactly {rule['text']!r}"


def _contains(text: str, rule: Mapping[str, Any]) -> str | None:
    ok = _fold(rule["text"], rule) in _fold(text, rule)
    return None if ok else f"does not contain {rule['text']!r}"


def _forbid(text: str, rule: Mapping[str, Any]) -> str | None:
    ok = _fold(rule["text"], rule) not in _fold(text, rule)
    return None if ok else f"contains forbidden {rule['text']!r}"


def _char_count(text: str, rule: Mapping[str, Any]) -> str | None:
    return _count_problem(f"{rule['char']!r} characters", text.count(rule["char"]), rule)


def _table_rows(text: str, rule: Mapping[str, Any]) -> str | None:
    rows = [ln for ln in _lines(text) if ln.strip().startswith("|") and ln.strip().endswith("|")]
    if rule.get("only") and len(rows) != len(_lines(text)):
        return "text outside the table"
    return _count_problem("table lines", len(rows), rule)


def _words_per_line(text: str, rule: Mapping[str, Any]) -> str | None:
    for ln in _lines(text):
        problem = _count_problem("words on a line", len(words(ln)), rule)
        if problem:
            return f"{problem} ({ln.strip()[:40]!r})"
    return None


RULES: dict[str, Callable[[str, Mapping[str, Any]], str | None]] = {
    "line_count": _line_count,
    "bullets": _bullets,
    "numbered": _numbered,
    "word_count": _word_count,
    "sentence_count": _sentence_count,
    "all_caps": _all_caps,
    "all_lower": _all_lower,
    "starts_with": _starts_with,
    "ends_with": _ends_with,
    "exact": _exact,
    "contains": _contains,
    "forbid": _forbid,
    "char_count": _char_count,
    "table_rows": _table_rows,
    "words_per_line": _words_per_line,
}
_NEEDS_TEXT = {"starts_with", "ends_with", "exact", "contains", "forbid"}
_COUNTING = {
    "line_count",
    "bullets",
    "numbered",
    "word_count",
    "sentence_count",
    "char_count",
    "table_rows",
    "words_per_line",
}


def validate(spec: Mapping[str, Any]) -> None:
    """``rules``: known rule names with the parameters they need."""
    rules = spec.get("rules")
    if not isinstance(rules, list) or not rules:
        raise ValueError("format check needs 'rules', a non-empty list")
    for i, rule in enumerate(rules):
        name = rule.get("rule") if isinstance(rule, Mapping) else None
        if name not in RULES:
            raise ValueError(f"rule {i + 1}: 'rule' must be one of {', '.join(RULES)}")
        if name in _NEEDS_TEXT and not isinstance(rule.get("text"), str):
            raise ValueError(f"rule {i + 1} ({name}) needs 'text'")
        if name in _COUNTING and not any(k in rule for k in ("n", "min", "max")):
            raise ValueError(f"rule {i + 1} ({name}) needs 'n', 'min' or 'max'")
        if name == "char_count" and not isinstance(rule.get("char"), str):
            raise ValueError(f"rule {i + 1} (char_count) needs 'char'")


def score(spec: Mapping[str, Any], answer: str) -> Verdict:
    """Every rule must hold on the stripped answer; the first broken one is the reason."""
    text = answer.strip()
    for rule in spec["rules"]:
        problem = RULES[rule["rule"]](text, rule)
        if problem:
            return Verdict.fail(f"{rule['rule']}: {problem}")
    return Verdict.ok(f"{len(spec['rules'])} rules hold")
