"""Pull the scorable part out of a model's answer: reasoning removed, code, JSON, a final number.

Every extractor is forgiving about wrapping (fences, bold, a trailing sentence) and strict about
content, so a checker judges what the model meant rather than how it decorated it.
"""

from __future__ import annotations

import json
import re
from typing import Any

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
# A reply cut off while still thinking has an opening tag and no closing one.
_OPEN_THINK = re.compile(r"<think>.*\Z", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_NUMBER = re.compile(r"[-+]?\$?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")
_ANSWER_CUE = re.compile(r"(?:final answer|answer is|answer:|answer =|result is|result:|=|\*\*)", re.IGNORECASE)


def strip_reasoning(text: str) -> str:
    """The answer without any <think>…</think> span (also an unclosed one at the end)."""
    text = _THINK.sub("", text)
    # Some templates put the opening tag in the prompt, so only the closing one is generated.
    if "</think>" in text.lower():
        text = re.split(r"</think>", text, flags=re.IGNORECASE)[-1]
    return _OPEN_THINK.sub("", text).strip()


def fences(text: str) -> list[tuple[str, str]]:
    """Every fenced block as (language, body), an unterminated last fence included."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def extract_code(text: str) -> str:
    """The longest ```python block (any fenced block if none is labelled), else the whole text."""
    blocks = fences(text)
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    pool = python or [body for _, body in blocks]
    if pool:
        return max(pool, key=len).strip("\n")
    return text.strip("\n")


def extract_json(text: str) -> Any:
    """The first JSON value in a ```json fence, else the outermost {…} or […] span.

    Raises ValueError (with json's message) when nothing parses.
    """
    candidates = [body for lang, body in fences(text) if lang in ("json", "")]
    stripped = text.strip()
    candidates.append(stripped)
    for open_ch, close_ch in (("{", "}"), ("[", "]")):
        lo, hi = stripped.find(open_ch), stripped.rfind(close_ch)
        if 0 <= lo < hi:
            candidates.append(stripped[lo : hi + 1])
    error = "no JSON found"
    for cand in candidates:
        try:
            return json.loads(cand)
        except json.JSONDecodeError as exc:
            error = f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    raise ValueError(error)


def _to_float(token: str) -> float | None:
    cleaned = token.replace(",", "").replace("$", "")
    try:
        return float(cleaned)
    except ValueError:
        return None


def _plain(line: str) -> str:
    return line.strip().strip("*_`$ .").replace("\\boxed{", "").rstrip("}")


def extract_final_number(text: str) -> float | None:
    """The final numeric answer.

    Preference: a \\boxed{} value; the last line that is only a number (bold/$ allowed); the last
    number after an answer cue ("final answer", "answer:", "=", "**"); the last number at all.
    """
    boxed = re.findall(r"\\boxed\{([^}]*)\}", text)
    if boxed:
        nums = _NUMBER.findall(boxed[-1])
        if nums:
            return _to_float(nums[-1])
    for line in reversed([ln for ln in text.splitlines() if ln.strip()]):
        plain = _plain(line)
        if _NUMBER.fullmatch(plain):
            return _to_float(plain)
        break
    cues = list(_ANSWER_CUE.finditer(text))
    if cues:
        nums = _NUMBER.findall(text[cues[-1].end() :])
        if nums:
            return _to_float(nums[0])
    nums = _NUMBER.findall(text)
    return _to_float(nums[-1]) if nums else None


def words(text: str) -> list[str]:
    """Whitespace-separated words that contain at least one letter or digit."""
    return [w for w in text.split() if any(ch.isalnum() for ch in w)]
