"""What an open-loop benchmark sends: conversations of one or more turns, with their lengths.

Datasets:

- ``random`` (default): each request a fresh nonce followed by the shipped haystack (real prose
  and code, as ``bench prefill`` uses) cut to the input length; nothing shared, so nothing cached.
- ``prefix``: every request of a tier starts with one shared system prompt of ``prefix_len``
  tokens, then a unique suffix of the input length — the shape of an agent or RAG deployment,
  where the prefix cache should answer all but the first request's prefix. The prefix is fresh
  per tier, so each tier pays one cold prefix and no tier inherits another's cache.
- ``multiturn``: conversations of ``turns`` user messages; turn k is sent when turn k − 1 has
  been answered, with the whole history (the real answers included) in front of it.
- a JSONL file, sent in its order (going round when a tier wants more): one request per
  line, ``{"prompt": "…"}`` with an optional ``"output_len"``, or
  ``{"turns": ["…", "…"]}`` for a conversation.

Lengths are tokens: ``256`` (fixed) or ``128:512`` (uniform, inclusive, seeded). Prompt text is
cut at a chars-per-token ratio the server's own tokenizer measured once; the figures reported
are always the server's ``usage``, never this estimate.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkfleet.bench.client import Api, RequestSpec
from sparkfleet.bench.corpus import haystack, nonce
from sparkfleet.errors import BenchError

DATASETS = ("random", "prefix", "multiturn")


@dataclass(frozen=True)
class Lengths:
    """A token length: fixed (``low == high``) or uniform on [low, high]."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str, option: str) -> Lengths:
        low_s, sep, high_s = text.strip().partition(":")
        try:
            low = int(low_s)
            high = int(high_s) if sep else low
        except ValueError:
            raise BenchError(f"bad {option} {text!r}: give tokens, e.g. 256, or a uniform range 128:512") from None
        if low < 1 or high < low:
            raise BenchError(f"bad {option} {text!r}: lengths are positive and a range is low:high")
        return cls(low, high)

    def draw(self, rng: random.Random) -> int:
        return self.low if self.low == self.high else rng.randint(self.low, self.high)

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}:{self.high}"


@dataclass(frozen=True)
class Turn:
    """One user message and the tokens asked for its answer."""

    text: str
    output_len: int


@dataclass(frozen=True)
class Conversation:
    """What one arrival sends: an optional shared system prompt and one or more turns."""

    turns: tuple[Turn, ...]
    system: str | None = None

    def spec(self, turn: int, replies: list[str], api: Api, base: RequestSpec) -> RequestSpec:
        """The request for turn ``turn``, given the answers to the turns before it."""
        out = self.turns[turn].output_len
        exact = base.min_tokens is not None
        if api == "chat":
            messages: list[dict[str, Any]] = [{"role": "system", "content": self.system}] if self.system else []
            for i in range(turn):
                messages += [
                    {"role": "user", "content": self.turns[i].text},
                    {"role": "assistant", "content": replies[i]},
                ]
            messages.append({"role": "user", "content": self.turns[turn].text})
            prompt = self.turns[turn].text
        else:
            messages = []
            parts = [self.system] if self.system else []
            for i in range(turn):
                parts += [self.turns[i].text, replies[i]]
            parts.append(self.turns[turn].text)
            prompt = "\n\n".join(parts)
        return RequestSpec(
            api=api,
            prompt=prompt,
            max_tokens=out,
            min_tokens=out if exact else None,
            ignore_eos=base.ignore_eos,
            temperature=base.temperature,
            continuous_usage=base.continuous_usage,
            extra=base.extra,
            messages=tuple(messages) if messages else None,
        )


@dataclass(frozen=True)
class WorkloadConfig:
    """Which dataset, and the lengths of its requests."""

    dataset: str = "random"
    input_len: Lengths = Lengths(256, 256)
    output_len: Lengths = Lengths(128, 128)
    prefix_len: int = 512
    turns: int = 1

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS and not self.dataset.endswith((".jsonl", ".json")):
            raise BenchError(f"unknown --dataset-name {self.dataset!r}: choose {', '.join(DATASETS)}, or custom with "
                             "--dataset-path FILE.jsonl")  # fmt: skip
        if self.turns < 1:
            raise BenchError("--turns must be at least 1")
        if self.prefix_len < 1:
            raise BenchError("--prefix-len must be at least 1 token")


def dataset_of(name: str | None, path: Path | None) -> str:
    """The dataset that --dataset-name and --dataset-path ask for: a name, or the custom one's file."""
    if path is not None:
        if name not in (None, "custom"):
            raise BenchError(f"--dataset-path is the custom dataset's file: drop --dataset-name {name} or give custom")
        return str(path)
    if name == "custom":
        raise BenchError("--dataset-name custom reads a .jsonl file: give it with --dataset-path FILE")
    return name or "random"


class Workload:
    """Draws conversations, seeded, with prompt text cut at ``chars_per_token``."""

    def __init__(self, config: WorkloadConfig, chars_per_token: float, seed: int = 0) -> None:
        self.config = config
        self.cpt = chars_per_token
        self.rng = random.Random(seed)
        self.file: list[Conversation] | None = None
        self.file_pos = 0
        if config.dataset not in DATASETS:
            self.file = load_dataset(Path(config.dataset), config.output_len, self.rng)

    def _text(self, tokens: int) -> str:
        head = f"[{nonce()}] "
        return head + haystack(max(0, int(tokens * self.cpt) - len(head)), self.rng.randrange(1 << 30))

    def _turn(self) -> Turn:
        return Turn(self._text(self.config.input_len.draw(self.rng)), self.config.output_len.draw(self.rng))

    def draw(self, count: int) -> list[Conversation]:
        """``count`` conversations for one tier (a fresh shared prefix for the prefix dataset)."""
        cfg = self.config
        if self.file is not None:
            # In file order, going round, so two tools given one file send the same sequence.
            start, self.file_pos = self.file_pos, self.file_pos + count
            return [self.file[i % len(self.file)] for i in range(start, start + count)]
        if cfg.dataset == "prefix":
            system = "You answer questions about the reference text below.\n\n" + self._text(cfg.prefix_len)
            return [Conversation((self._turn(),), system) for _ in range(count)]
        turns = cfg.turns if cfg.dataset == "multiturn" else 1
        return [Conversation(tuple(self._turn() for _ in range(turns))) for _ in range(count)]


def load_dataset(path: Path, output_len: Lengths, rng: random.Random) -> list[Conversation]:
    """Conversations from a JSONL file (see the module docstring for the line format)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BenchError(f"--dataset-path {path}: cannot read it ({exc.strerror})") from exc
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise BenchError(f"--dataset-path {path}:{n}: not a JSON object") from None
        if not isinstance(obj, dict):
            raise BenchError(f"--dataset-path {path}:{n}: not a JSON object")
        out_len = obj.get("output_len")
        if out_len is not None and (not isinstance(out_len, int) or out_len < 1):
            raise BenchError(f"--dataset-path {path}:{n}: output_len must be a positive integer")
        texts = obj.get("turns") if "turns" in obj else [obj.get("prompt")]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            raise BenchError(f'--dataset-path {path}:{n}: needs "prompt" (a string) or "turns" (a list of strings)')
        out.append(Conversation(tuple(Turn(t, out_len or output_len.draw(rng)) for t in texts)))
    if not out:
        raise BenchError(f"--dataset-path {path}: no requests in it")
    return out
