"""Pull the scorable part out of a model's answer: reasoning removed, code, JSON, a final number.

Every extractor is forgiving about wrapping (fences, bold, a trailing sentence) and strict about
content, so a checker judges what the model meant rather than how it decorated it. Answers are
read from what the model said, not from its code: a number or word that only appears as a
literal in a program (fenced, inline or bare) is not an answer.
"""

from __future__ import annotations

import json
import re
from typing import Any

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
# A reply cut off while still thinking has an opening tag and no closing one.
_OPEN_THINK = re.compile(r"<think>.*\Z", re.DOTALL | re.IGNORECASE)
# A fence (``` or ~~~, three or more) opens at a line start or after a space or colon, never
# right after other text: so the closing half of an inline ```8``` cannot open a block. It runs
# to the same fence, wherever that is, or to the end (a reply cut off inside its code).
_FENCE = re.compile(
    r"(?:^|(?<=[\s:]))(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[A-Za-z0-9_+.#-]*)[^\n`]*\n(?P<body>.*?)(?:(?P=fence)|\Z)",
    re.DOTALL | re.MULTILINE,
)
# Inline code: a run of backticks, then the same run; it may wrap but not cross a blank line.
_INLINE = re.compile(r"(?<!`)(`+)(?!`)(?P<body>(?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.DOTALL)
_PARAGRAPH_BREAK = re.compile(r"(\n[ \t]*\n)")
# Lines that only a program has: Python statements a sentence does not start with (keywords
# are lowercase, compound headers end in a colon) and statement-like calls such as x.append(...).
_STATEMENT = re.compile(
    r"^[ \t]*(?:"
    r"(?:async[ \t]+)?(?:def|class)[ \t]+[A-Za-z_]\w*[ \t]*[(:]"
    r"|import[ \t]+[A-Za-z_][\w.]*[ \t]*(?:,|as\b|$)"
    r"|from[ \t]+[\w.]+[ \t]+import[ \t]"
    r"|(?:while|if|elif|with|except)\b[^\n]*:[ \t]*$"
    r"|while[ \t][^\n]*:[ \t]*\S"
    r"|for[ \t][^\n]*?[ \t]in[ \t][^\n]*:"
    r"|(?:try|else|finally)[ \t]*:"
    r"|(?:return|yield|raise|assert|del|global|nonlocal)\b"
    r"|(?:pass|break|continue)[ \t]*;?[ \t]*$"
    r"|(?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*\(.*\)[ \t]*;?[ \t]*$"
    r"|(?:print|exec|eval|open|input|bytearray)\(.*\)[ \t]*;?[ \t]*$"
    r"|[A-Za-z_][\w.]*(?:\[[^\]\n]*\])?[ \t]*(?://|\*\*|[-+*/%|&^])=[ \t]*\S"
    r")",
    re.MULTILINE,
)
# Lines that belong to a program once the text has one: assignments, comments, indented lines.
_CODE_LIKE = re.compile(r"^(?:[ \t]+\S|[ \t]*#|[ \t]*[A-Za-z_][\w.]*(?:\[[^\]\n]*\])?[ \t]*=(?!=))")
_NUMBER = re.compile(r"[-+]?\$?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")
# A power such as 10**8 or 2**-3: its numbers are operands, never the answer.
_POWER = re.compile(r"[\w.]*\w(?:\*\*-?\w[\w.]*)+")
_ANSWER_CUE = re.compile(r"final answer|answer is|answer:|answer =|result is|result:|=", re.IGNORECASE)
# Bold as a cue needs both halves: **8**, **Answer: 8**. A lone ** (an exponent) is not bold.
_BOLD = re.compile(r"(?<![\w*])\*\*(?![\s*])(?:[^\n]*?[^\s*])?\*\*(?![\w*])")


def strip_reasoning(text: str) -> str:
    """The answer without any <think>…</think> span (also an unclosed one at the end)."""
    text = _THINK.sub("", text)
    # Some templates put the opening tag in the prompt, so only the closing one is generated.
    if "</think>" in text.lower():
        text = re.split(r"</think>", text, flags=re.IGNORECASE)[-1]
    return _OPEN_THINK.sub("", text).strip()


def fences(text: str) -> list[tuple[str, str]]:
    """Every fenced block (``` or ~~~) as (language, body), an unterminated last fence included."""
    return [(m.group("lang").lower(), m.group("body")) for m in _FENCE.finditer(text)]


def inline_code(text: str) -> list[str]:
    """The bodies of the `inline code` spans outside fenced blocks."""
    return [m.group("body") for m in _INLINE.finditer(_FENCE.sub("\n", text))]


def _bare_program(paragraph: str) -> bool:
    return all(_CODE_LIKE.match(line) for line in paragraph.splitlines() if line.strip())


def without_code(text: str) -> str:
    """The text with its code blanked out, so that what remains is what the model said.

    Code is a fenced block (``` or ~~~, closed or not), an inline `span`, or an unfenced program:
    a paragraph with a statement only code has (while …:, def, import, x.append(…)); once there
    is one, paragraphs of nothing but assignments, comments and indented lines go with it.
    A literal in a program is data the program would use, never the model's answer.
    """
    text = _INLINE.sub(" ", _FENCE.sub("\n", text))
    parts = _PARAGRAPH_BREAK.split(text)
    paragraphs = parts[0::2]
    code = [bool(_STATEMENT.search(p)) for p in paragraphs]
    if not any(code):
        return text
    parts[0::2] = ["" if is_code or _bare_program(p) else p for p, is_code in zip(paragraphs, code, strict=True)]
    return "".join(parts)


def extract_code(text: str) -> str:
    """The longest ```python block (any fenced block if none is labelled), else the whole text."""
    blocks = fences(text)
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    pool = python or [body for _, body in blocks]
    if pool:
        return max(pool, key=len).strip("\n")
    return text.strip("\n")


def extract_json(text: str) -> Any:
    """The first JSON value: a fence or inline span that is JSON, the text itself, else a {…}/[…] span.

    Spans are looked for in ```json fences and in the prose around code, never inside a program:
    a Python literal that happens to be the wanted document is not an answer. Raises ValueError
    (with json's message) when nothing parses.
    """
    blocks = fences(text)
    # A body that is JSON from end to end is data whatever its label says (```python [1, 2]).
    candidates = [body for lang, body in blocks if lang in ("json", "")]
    candidates += [body for lang, body in blocks if lang not in ("json", "")]
    candidates += inline_code(text)
    candidates.append(text.strip())
    for source in [*(body for lang, body in blocks if lang == "json"), without_code(text)]:
        stripped = source.strip()
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
    return line.strip().strip("*_$ .").replace("\\boxed{", "").rstrip("}")


def _last_cue_tail(text: str) -> str | None:
    """The text after the last answer cue: a phrase, "=", or a bold span (from inside it)."""
    cues = [(m.start(), m.end()) for m in _ANSWER_CUE.finditer(text)]
    cues += [(m.start(), m.start() + 2) for m in _BOLD.finditer(text)]
    if not cues:
        return None
    return text[max(cues)[1] :]


def extract_final_number(text: str) -> float | None:
    """The final numeric answer, read from what the model said, never from its code.

    Code (see ``without_code``) and the operands of a power (10**8) are ignored. Then the
    preference: a \\boxed{} value; the last line if it is only a number (bold/$ allowed); the
    first number after the last answer cue ("final answer", "answer:", "=", a **bold** span);
    the last number at all.
    """
    text = _POWER.sub(" ", without_code(text))
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
    tail = _last_cue_tail(text)
    if tail is not None:
        nums = _NUMBER.findall(tail)
        if nums:
            return _to_float(nums[0])
    nums = _NUMBER.findall(text)
    return _to_float(nums[-1]) if nums else None


def words(text: str) -> list[str]:
    """Whitespace-separated words that contain at least one letter or digit."""
    return [w for w in text.split() if any(ch.isalnum() for ch in w)]
