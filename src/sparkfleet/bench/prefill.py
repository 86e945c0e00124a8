"""Prefill benchmark: prompt lengths up to the model's context, real text, nothing cached.

Each prompt is a fresh nonce followed by the shipped haystack (documentation prose and source
code from seeded offsets), sent to ``/v1/completions`` with ``max_tokens`` 1, so TTFT is prefill
plus a fixed overhead (HTTP, scheduling, one decode step, detokenisation) that a tiny request
measures first. Lengths above the context (less a small margin) are dropped and the context limit
itself becomes the last length. Prompt lengths are fitted with the server's ``/tokenize`` when it
has one; the rate always uses the server's own ``usage.prompt_tokens``. A request that reports
cached prompt tokens is flagged: its rate is not a cold prefill.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from sparkfleet.bench.client import Api, RequestRecord, RequestSpec, stream_request
from sparkfleet.bench.corpus import PREFILL_LENGTHS, haystack, nonce, prefill_frame
from sparkfleet.bench.endpoint import Endpoint
from sparkfleet.bench.progress import NullProgress, Progress
from sparkfleet.bench.stats import PrefillSample, prefill_sample
from sparkfleet.errors import BenchError

DEFAULT_LENGTHS = PREFILL_LENGTHS
CONTEXT_MARGIN = 16  # tokens left for the answer and any template the server adds
CALIBRATION_CHARS = 24_000


@dataclass(frozen=True)
class PrefillConfig:
    """What ``bench prefill`` runs."""

    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    repeats: int = 2
    max_context: int | None = None
    overhead_samples: int = 3
    warmup: bool = True
    api: Api = "completions"
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.lengths or any(n < 32 for n in self.lengths):
            raise BenchError("prefill lengths must be at least 32 tokens, e.g. 4k,16k,32k")
        if self.repeats < 1 or self.overhead_samples < 1:
            raise BenchError("--repeats and --overhead-samples must be at least 1")


@dataclass(frozen=True)
class PrefillPlan:
    """The lengths that will run and why some did not."""

    lengths: tuple[int, ...]
    context: int | None
    dropped: tuple[int, ...]


@dataclass(frozen=True)
class PrefillRun:
    """One measured prefill request."""

    length: int
    repeat: int
    record: RequestRecord
    sample: PrefillSample

    @property
    def tier(self) -> str:
        return str(self.length)


def plan_lengths(lengths: tuple[int, ...], context: int | None) -> PrefillPlan:
    """Clip ``lengths`` to ``context − margin``; the limit replaces the dropped lengths."""
    wanted = tuple(sorted(set(lengths)))
    if context is None:
        return PrefillPlan(wanted, None, ())
    limit = context - CONTEXT_MARGIN
    kept = tuple(n for n in wanted if n <= limit)
    dropped = tuple(n for n in wanted if n > limit)
    if dropped and (not kept or kept[-1] < limit):
        kept = (*kept, limit)
    return PrefillPlan(kept, context, dropped)


def request_timeout(tokens: int) -> float:
    """Generous per-request limit: a 262k cold prefill takes minutes (sparkDash's rule)."""
    return min(45 * 60.0, max(90.0, 60.0 + 0.008 * tokens))


class TokenCounter:
    """Counts prompt tokens with the server's tokenizer: ``/tokenize`` or a 1-token request."""

    def __init__(self, client: httpx.AsyncClient, endpoint: Endpoint, config: PrefillConfig) -> None:
        self.client = client
        self.endpoint = endpoint
        self.config = config
        self.route: str | None = None

    async def count(self, text: str) -> int:
        if self.route != "usage":
            for route, body in self._routes(text):
                if self.route not in (None, route):
                    continue
                try:
                    response = await self.client.post(self.endpoint.base_url + route, json=body, timeout=120)
                except httpx.HTTPError:
                    continue
                if response.status_code == 200:
                    try:
                        data = response.json()
                    except ValueError:
                        continue
                    if not isinstance(data, dict):
                        continue
                    n = data.get("count") if isinstance(data.get("count"), int) else len(data.get("tokens") or [])
                    if n:
                        self.route = route
                        return int(n)
            self.route = "usage"
        rec = await stream_request(self.client, self.endpoint.base_url, self.endpoint.model, self._spec(text))
        if not rec.ok or rec.prompt_tokens is None:
            raise BenchError(f"endpoint {self.endpoint.base_url}: cannot count prompt tokens: {rec.error}")
        return rec.prompt_tokens

    def _routes(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        return [
            ("/tokenize", {"model": self.endpoint.model, "prompt": text, "add_special_tokens": True}),
            ("/tokenize", {"content": text, "add_special": True}),  # llama.cpp's llama-server
            ("/extras/tokenize", {"input": text}),  # llama-cpp-python
        ]

    def _spec(self, prompt: str) -> RequestSpec:
        return prefill_spec(self.endpoint, self.config, prompt)


def prefill_spec(endpoint: Endpoint, config: PrefillConfig, prompt: str) -> RequestSpec:
    """A max_tokens-1 request; llama.cpp is told not to reuse its prompt cache."""
    extra: dict[str, Any] = dict(config.extra_body)
    if endpoint.engine in ("llama-cpp", "llama-cpp-python"):
        extra.setdefault("cache_prompt", False)
    return RequestSpec(api=config.api, prompt=prompt, max_tokens=1, temperature=0.0, extra=extra)


async def fitted_prompt(counter: TokenCounter, tokens: int, chars_per_token: float, seed: int) -> tuple[str, int]:
    """A prompt of about ``tokens`` tokens (never above, when the server can tokenize).

    One nonce and one haystack are drawn, and only the cut of the haystack moves while fitting,
    so each step changes nothing but the length. Without a tokenize route the length is
    estimated from the calibration ratio: counting the prompt itself with a request would put it
    in the prefix cache before it is measured.
    """
    head, tail = prefill_frame()
    body = haystack(int(tokens * chars_per_token * 1.25) + 256, seed)
    cut = max(0, min(len(body), int(tokens * chars_per_token) - len(head) - len(tail)))
    if counter.route == "usage":
        return head + body[:cut] + tail, tokens
    tolerance = max(8, tokens // 200)
    best: tuple[str, int] | None = None
    for _ in range(10):
        prompt = head + body[:cut] + tail
        counted = await counter.count(prompt)
        if counted <= tokens and (best is None or counted > best[1]):
            best = (prompt, counted)
        if counted <= tokens and tokens - counted <= tolerance:
            break
        step = int((tokens - counted) * chars_per_token)
        if counted > tokens:
            step -= 8  # always end up below the target
        cut = max(0, min(len(body), cut + step))
    if best is None:
        raise BenchError(f"cannot fit a prompt of {tokens} tokens (the frame alone is {counted})")
    return best


async def run_prefill(
    endpoint: Endpoint,
    config: PrefillConfig,
    progress: Progress | None = None,
    on_run: Callable[[PrefillRun], None] | None = None,
    on_overhead: Callable[[float, PrefillPlan], None] | None = None,
) -> list[PrefillRun]:
    """Measure the overhead, warm up, then every length ``repeats`` times (in passes)."""
    progress = progress or NullProgress()
    plan = plan_lengths(config.lengths, config.max_context or endpoint.max_model_len)
    if not plan.lengths:
        raise BenchError(f"no prefill length fits the context of {plan.context} tokens")
    runs: list[PrefillRun] = []
    timeout = httpx.Timeout(request_timeout(max(plan.lengths)), connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, headers=endpoint.headers()) as client:
        counter = TokenCounter(client, endpoint, config)
        sample_text = haystack(CALIBRATION_CHARS, seed=7)
        chars_per_token = CALIBRATION_CHARS / max(1, await counter.count(sample_text))

        progress.start("overhead (tiny requests)", config.overhead_samples)
        ttfts = []
        for _ in range(config.overhead_samples):
            spec = prefill_spec(endpoint, config, f"[{nonce()}] Reply OK.")
            rec = await stream_request(client, endpoint.base_url, endpoint.model, spec)
            progress.advance(rec)
            if not rec.ok or rec.ttft is None:
                raise BenchError(f"endpoint {endpoint.base_url} failed a tiny request: {rec.error}")
            ttfts.append(rec.ttft)
        overhead = statistics.median(ttfts)
        progress.finish(f"fixed overhead {overhead * 1000:.1f} ms (median TTFT of {len(ttfts)} tiny requests)")
        if on_overhead is not None:
            on_overhead(overhead, plan)

        seed = 1000
        if config.warmup:
            first = plan.lengths[0]
            progress.start(f"warm-up {first} tokens", 1)
            prompt, _ = await fitted_prompt(counter, first, chars_per_token, seed)
            rec = await stream_request(
                client, endpoint.base_url, endpoint.model, prefill_spec(endpoint, config, prompt)
            )
            progress.advance(rec)
            progress.finish(None)
            if not rec.ok:
                raise BenchError(f"endpoint {endpoint.base_url} failed the prefill warm-up: {rec.error}")
        for rep in range(config.repeats):
            for length in plan.lengths:
                seed += 1
                progress.start(f"{length} tokens, pass {rep + 1}/{config.repeats}", 1)
                prompt, _ = await fitted_prompt(counter, length, chars_per_token, seed)
                spec = prefill_spec(endpoint, config, prompt)
                rec = await asyncio.wait_for(
                    stream_request(client, endpoint.base_url, endpoint.model, spec),
                    request_timeout(length) + 30,
                )
                progress.advance(rec)
                sample = prefill_sample(rec, length, overhead)
                run = PrefillRun(length, rep, rec, sample)
                runs.append(run)
                if on_run is not None:
                    on_run(run)
                flag = f"  CACHED {sample.cached_tokens} tokens" if sample.cached_tokens else ""
                progress.finish(
                    f"{length} pass {rep + 1}: {sample.prompt_tokens} tokens, TTFT "
                    f"{(sample.ttft or 0) * 1000:.0f} ms, {sample.rate or 0:.0f} tok/s{flag}"
                    if sample.rate is not None
                    else f"{length} pass {rep + 1}: failed: {rec.error}"
                )
                if not rec.ok and not any(r.record.ok for r in runs):
                    raise BenchError(f"endpoint {endpoint.base_url}: prefill of {length} tokens failed: {rec.error}")
    return runs
