"""Needle in a haystack: a length x depth grid, a fresh random needle per cell, exact match.

The haystack is real, varied prose (the Python documentation text the bench ships for prefill,
``sparkfleet.data.bench``), taken from a random paragraph offset per cell so no two cells share a
prefix a cache could answer. The needle is "The access code for the <adjective>-<noun> vault is
<7 digits>." at ``depth`` percent of the haystack, moved back to a paragraph or sentence start.
The question asks for that code; the cell passes when the first 7-digit number in the answer is
exactly the code. Lengths are prompt tokens, measured with the server's tokenizer when it has
a tokenize route (otherwise estimated, and the server's ``usage.prompt_tokens`` is reported).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sparkfleet.bench.corpus import load_haystack
from sparkfleet.errors import EvalError

if TYPE_CHECKING:
    # The client brings httpx; `sparkfleet eval needle --help` reads this module's grid without it.
    from sparkfleet.evals.client import Api, EvalClient
    from sparkfleet.evals.memguard import MemGuard

DEFAULT_LENGTHS = (1024, 2048, 4096)
DEFAULT_DEPTHS = (0.0, 25.0, 50.0, 75.0, 100.0)
ANSWER_TOKENS = 24
# Room left in the context for the answer and the chat template's own tokens.
CONTEXT_MARGIN = ANSWER_TOKENS + 64
_FALLBACK_CHARS_PER_TOKEN = 4.0
_ADJECTIVES = (
    "amber", "brisk", "copper", "dusty", "eager", "frosty", "gentle", "hollow", "ivory", "jolly",
    "keen", "lunar", "mellow", "narrow", "olive", "proud", "quiet", "rusty", "silent", "tidy",
    "upper", "velvet", "woven", "young", "zesty", "crimson", "silver", "northern", "sunken", "wild",
)  # fmt: skip
_NOUNS = (
    "anchor", "badger", "candle", "dolphin", "engine", "falcon", "garden", "harbor", "island",
    "jacket", "kettle", "lantern", "meadow", "needle", "orchard", "pepper", "quarry", "river",
    "saddle", "tunnel", "umbrella", "valley", "walrus", "yonder", "zeppelin", "otter", "cactus",
    "glacier", "pebble", "violin",
)  # fmt: skip
_CODE = re.compile(r"(?<!\d)\d{7}(?!\d)")


@dataclass(frozen=True)
class NeedleCell:
    """One grid cell: where the needle was, what was asked, what came back."""

    length: int
    depth: float
    tokens: int | None
    key: str
    expected: str
    answer: str
    passed: bool
    seconds: float
    finish_reason: str


@dataclass(frozen=True)
class NeedleRun:
    """A whole needle grid."""

    id: str
    label: str
    endpoint: str
    model: str
    api: str
    token_counting: str
    seed: int
    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    skipped_lengths: tuple[int, ...]
    started_utc: str
    wall_s: float
    cells: tuple[NeedleCell, ...]
    memguard: tuple[str, ...] = ()

    @property
    def passed(self) -> int:
        return sum(c.passed for c in self.cells)

    @property
    def total(self) -> int:
        return len(self.cells)

    def cell(self, length: int, depth: float) -> NeedleCell | None:
        for c in self.cells:
            if c.length == length and c.depth == depth:
                return c
        return None

    @property
    def effective_length(self) -> int | None:
        """The longest length at which every depth passed (None when none did)."""
        good = [
            length
            for length in self.lengths
            if all((c := self.cell(length, d)) is not None and c.passed for d in self.depths)
        ]
        return max(good) if good else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["effective_length"] = self.effective_length
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NeedleRun:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["lengths"] = tuple(fields["lengths"])
        fields["depths"] = tuple(float(d) for d in fields["depths"])
        fields["skipped_lengths"] = tuple(fields.get("skipped_lengths", ()))
        fields["cells"] = tuple(NeedleCell(**c) for c in data["cells"])
        fields["memguard"] = tuple(fields.get("memguard", ()))
        return cls(**fields)


def paragraphs() -> list[str]:
    """The haystack source cut into paragraphs (blank-line separated, non-trivial)."""
    prose, _ = load_haystack()
    return [p.strip() for p in re.split(r"\n\s*\n", prose) if len(p.strip()) > 40]


def make_haystack(chars: int, start: int, paras: Sequence[str]) -> str:
    """``chars`` characters of consecutive paragraphs from paragraph ``start`` (wrapping)."""
    out: list[str] = []
    total = 0
    i = start
    while total < chars:
        out.append(paras[i % len(paras)])
        total += len(out[-1]) + 2
        i += 1
    return "\n\n".join(out)[:chars]


def insert_needle(haystack: str, needle: str, depth: float) -> str:
    """Put the needle at ``depth`` % of the haystack, moved back to a paragraph/sentence start."""
    if depth >= 100:
        return f"{haystack.rstrip()}\n\n{needle}"
    pos = int(len(haystack) * depth / 100)
    if pos > 0:
        cut = max(haystack.rfind("\n\n", 0, pos), haystack.rfind(". ", 0, pos))
        pos = cut + 2 if cut >= 0 else 0
    return f"{haystack[:pos]}{needle} {haystack[pos:]}"


def make_prompt(haystack: str, key: str) -> str:
    """The question frame around the haystack."""
    return (
        "Below is a long text. Somewhere in it is an access code for a vault. Read it carefully; "
        "you will be asked for the code.\n\n"
        f"{haystack}\n\n"
        f"What is the access code for the {key} vault? Answer with the 7-digit code only."
    )


def score_answer(answer: str, expected: str) -> bool:
    """Exact match: the first 7-digit number in the answer is the code."""
    found = _CODE.search(answer)
    return bool(found and found.group(0) == expected)


class _Sizer:
    """Fits a prompt to a token length with the server's tokenizer (or an estimate)."""

    def __init__(self, client: EvalClient, paras: Sequence[str]) -> None:
        self.client = client
        sample = "\n\n".join(paras[:60])
        counted = client.count_tokens(sample)
        self.exact = counted is not None
        self.chars_per_token = len(sample) / counted if counted else _FALLBACK_CHARS_PER_TOKEN

    def count(self, text: str) -> int | None:
        return self.client.count_tokens(text) if self.exact else None

    def fit(self, length: int, build: Callable[[int], str]) -> tuple[str, int | None]:
        chars = int(length * self.chars_per_token)
        prompt = build(chars)
        for _ in range(3):
            tokens = self.count(prompt)
            if tokens is None or abs(tokens - length) <= max(8, length // 100):
                return prompt, tokens
            chars = max(100, int(chars * length / tokens))
            prompt = build(chars)
        return prompt, self.count(prompt)


def run_needle(
    client: EvalClient,
    *,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    context: int | None = None,
    label: str | None = None,
    seed: int | None = None,
    api: Api | None = None,
    on_cell: Callable[[NeedleCell], None] | None = None,
    guard: MemGuard | None = None,
) -> NeedleRun:
    """Run the grid, shortest length first; lengths beyond the context are skipped and listed.

    With a memory guard, the grid stops at the first trip: the cell in flight is recorded as
    failed ("aborted by the memory guard") and the guard's low-water marks go into the result.
    """
    from sparkfleet.evals.runner import choose_api, new_run_id

    if any(d < 0 or d > 100 for d in depths):
        raise EvalError("needle depths must be between 0 and 100 percent")
    if any(n < 64 for n in lengths):
        raise EvalError("needle lengths must be at least 64 tokens")
    limit = context - CONTEXT_MARGIN if context else None
    usable = sorted({n for n in lengths if limit is None or n <= limit})
    skipped = tuple(sorted({n for n in lengths if limit is not None and n > limit}))
    if not usable:
        raise EvalError(f"every needle length exceeds the model's context ({context} tokens)")
    seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    chosen: Api = api or choose_api(client, "auto")[0]
    paras = paragraphs()
    sizer = _Sizer(client, paras)
    run_id = new_run_id("n")
    started = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    cells: list[NeedleCell] = []
    if guard:
        guard.start()
    try:
        _grid(client, chosen, usable, depths, rng, paras, sizer, cells, on_cell, guard)
    finally:
        report = guard.stop().lines() if guard else []
    counting = (
        "server tokenizer (/tokenize), prompt_tokens from usage"
        if sizer.exact
        else f"estimated at {_FALLBACK_CHARS_PER_TOKEN} chars/token (no tokenize route); tokens from usage"
    )
    return NeedleRun(
        id=run_id,
        label=label or run_id,
        endpoint=client.base_url,
        model=client.model,
        api=chosen,
        token_counting=counting,
        seed=seed,
        lengths=tuple(usable),
        depths=tuple(float(d) for d in depths),
        skipped_lengths=skipped,
        started_utc=started,
        wall_s=round(time.monotonic() - t0, 1),
        cells=tuple(cells),
        memguard=tuple(report),
    )


def _grid(
    client: EvalClient,
    chosen: Api,
    usable: Sequence[int],
    depths: Sequence[float],
    rng: random.Random,
    paras: Sequence[str],
    sizer: _Sizer,
    cells: list[NeedleCell],
    on_cell: Callable[[NeedleCell], None] | None,
    guard: MemGuard | None,
) -> None:
    for length in usable:
        for depth in depths:
            if guard and guard.tripped.is_set():
                return
            key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
            code = str(rng.randrange(1_000_000, 10_000_000))
            needle = f"The access code for the {key} vault is {code}."
            start = rng.randrange(len(paras))

            def build(
                chars: int, needle: str = needle, depth: float = depth, key: str = key, start: int = start
            ) -> str:
                hay = make_haystack(chars, start, paras)
                return make_prompt(insert_needle(hay, needle, depth), key)

            prompt, tokens = sizer.fit(length, build)
            t0 = time.monotonic()
            try:
                reply = client.ask(chosen, prompt, max_tokens=ANSWER_TOKENS, thinking=False)
            except EvalError:
                if not (guard and guard.tripped.is_set()):
                    raise
                cells.append(
                    NeedleCell(
                        length,
                        depth,
                        tokens,
                        key,
                        code,
                        "aborted by the memory guard",
                        False,
                        round(time.monotonic() - t0, 2),
                        "aborted",
                    )
                )
                return
            cell = NeedleCell(
                length=length,
                depth=depth,
                tokens=reply.prompt_tokens or tokens,
                key=key,
                expected=code,
                answer=reply.content[:200],
                passed=score_answer(reply.content, code),
                seconds=round(reply.seconds, 2),
                finish_reason=reply.finish_reason,
            )
            cells.append(cell)
            if on_cell:
                on_cell(cell)


def run_stored(target: str, model: str | None = None, *, lengths: Sequence[int] = DEFAULT_LENGTHS,
               depths: Sequence[float] = DEFAULT_DEPTHS, seed: int | None = None, label: str | None = None,
               timeout: float = 1800.0, mem_floor_gib: float = 0.0, cluster: str | None = None,
               on_cell: Callable[[NeedleCell], None] | None = None, api_key: str | None = None,
               ) -> NeedleRun:  # fmt: skip
    """``sparkfleet eval needle``: the grid against a deployment (by name) or an endpoint URL,
    with a memory guard over the cluster's nodes when ``mem_floor_gib`` is set; the run is stored."""
    from sparkfleet.bench.endpoint import resolve_endpoint
    from sparkfleet.config.cluster import load_cluster
    from sparkfleet.evals.client import EvalClient
    from sparkfleet.evals.memguard import MemGuard, abort_action_for
    from sparkfleet.evals.store import save
    from sparkfleet.nodes.transport import transport_for
    from sparkfleet.state.store import Store

    endpoint = resolve_endpoint(target, model, api_key=api_key)
    client = EvalClient(endpoint.base_url, endpoint.model, api_key=endpoint.api_key, timeout=timeout)
    guard = None
    if mem_floor_gib > 0:
        action = abort_action_for(endpoint.engine, endpoint.base_url, client.http)
        guard = MemGuard([transport_for(n) for n in load_cluster(cluster).nodes], int(mem_floor_gib * 1024**3),
                         [action] if action else [])  # fmt: skip
    try:
        run = run_needle(client, lengths=lengths, depths=depths, context=endpoint.max_model_len, label=label,
                         seed=seed, guard=guard, on_cell=on_cell)  # fmt: skip
    finally:
        client.close()
    save(Store(), "needle", run)
    return run
