"""The text benchmarks send: our decode prompts and the prefill haystack, shipped in the package.

The haystack is real, varied text — Python documentation prose and standard-library source
(see ``data/bench/NOTICE.md``) — cut into blocks that alternate between the two, each from a
seeded random offset, so no two prompts share more than chance overlap and no run leans on a
repeated filler token that an n-gram or row cache could answer.
"""

from __future__ import annotations

import gzip
import json
import random
import uuid
from functools import lru_cache
from importlib import resources

from sparkfleet.errors import BenchError

PROMPT_TYPES = ("prose", "code", "structured", "json")
_DATA = "sparkfleet.data.bench"
_BLOCK_MIN, _BLOCK_MAX = 1500, 6000


@lru_cache(maxsize=1)
def load_prompts() -> dict[str, tuple[str, ...]]:
    """Decode prompts by type (``prose``, ``code``, ``structured``, ``json``)."""
    raw = resources.files(_DATA).joinpath("prompts.json").read_text(encoding="utf-8")
    data = json.loads(raw)
    return {kind: tuple(data[kind]) for kind in PROMPT_TYPES}


def prompt_types(requested: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Validate a list of prompt types (comma-separated string or sequence)."""
    names = [p.strip() for p in requested.split(",")] if isinstance(requested, str) else list(requested)
    names = [n for n in names if n]
    unknown = [n for n in names if n not in PROMPT_TYPES]
    if unknown or not names:
        raise BenchError(f"unknown prompt type {', '.join(unknown) or '(none)'}; choose from {', '.join(PROMPT_TYPES)}")
    return tuple(names)


@lru_cache(maxsize=1)
def load_haystack() -> tuple[str, str]:
    """(prose, code) texts of the prefill haystack."""
    base = resources.files(_DATA)
    prose = gzip.decompress(base.joinpath("prose.txt.gz").read_bytes()).decode("utf-8")
    code = gzip.decompress(base.joinpath("code.txt.gz").read_bytes()).decode("utf-8")
    return prose, code


def haystack(chars: int, seed: int) -> str:
    """``chars`` characters of alternating prose and code blocks, cut at line ends, seeded."""
    rng = random.Random(seed)
    sources = load_haystack()
    parts: list[str] = []
    total = 0
    turn = rng.randrange(2)
    while total < chars:
        text = sources[turn % 2]
        size = rng.randint(_BLOCK_MIN, _BLOCK_MAX)
        at = rng.randrange(0, max(1, len(text) - size))
        at = text.find("\n", at) + 1 if text.find("\n", at) >= 0 else at
        block = text[at : at + size]
        cut = block.rfind("\n")
        block = block[: cut + 1] if cut > 0 else block
        parts.append(block)
        total += len(block)
        turn += 1
    return "".join(parts)[:chars]


def nonce() -> str:
    """A fresh tag to put first in a prompt so that no prefix cache can answer it."""
    return uuid.uuid4().hex[:16]


def decode_prompt(kind: str, index: int) -> str:
    """The ``index``-th prompt of a type (round robin), behind a fresh nonce."""
    prompts = load_prompts()[kind]
    return f"[{nonce()}] {prompts[index % len(prompts)]}"


# The prompt lengths (tokens) of a default prefill sweep; here, not in prefill.py, because
# `bench prefill --help` shows them and must not load httpx and numpy to do so.
PREFILL_LENGTHS = (4096, 16384, 32768, 65536, 131072, 262144)
PREFILL_HEAD = "[prefill {tag}] Read the text below, then reply with the single word OK.\n\n"
PREFILL_TAIL = "\n\nReply with the single word OK."


def prefill_frame() -> tuple[str, str]:
    """(head, tail) around a prefill haystack; the head starts with a fresh nonce."""
    return PREFILL_HEAD.format(tag=nonce()), PREFILL_TAIL


def prefill_prompt(chars: int, seed: int) -> str:
    """A prefill prompt of about ``chars`` characters: nonce first, then the haystack."""
    head, tail = prefill_frame()
    body = max(0, chars - len(head) - len(tail))
    return head + haystack(body, seed) + tail
