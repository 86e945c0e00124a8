"""Decode benchmark: concurrency tiers × prompt types, exactly N new tokens, repeats.

Each tier run is closed-loop at fixed concurrency: ``concurrency × waves`` requests, at most
``concurrency`` in flight (a semaphore, like ``vllm bench serve --max-concurrency``). Before a
tier's measured runs, ``warmups`` waves at the same concurrency with short answers are sent and
discarded. Stream ``i`` of every run gets prompt ``i`` of the type (round robin), so repeats and
concurrency columns share one prompt set (c1's prompt is in c2's, …); every prompt starts with a
fresh nonce, so no run is answered by the prefix cache of a previous one. Exact length is asked
with ``max_tokens`` + ``min_tokens`` + ``ignore_eos`` and checked against ``usage``: a probe
before the first tier tells whether the engine enforces it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sparkfleet.bench.chat_api import HINT, refuses_chat
from sparkfleet.bench.client import NO_USAGE_ERROR, Api, RequestRecord, RequestSpec, check_api, stream_request
from sparkfleet.bench.corpus import PROMPT_TYPES, decode_prompt
from sparkfleet.bench.endpoint import Endpoint
from sparkfleet.bench.progress import NullProgress, Progress
from sparkfleet.bench.stats import DecodeRunStats, decode_run_stats
from sparkfleet.errors import BenchError

PROBE_TOKENS = 16
PROBE_PROMPT = "Reply with the single word OK."


@dataclass(frozen=True)
class DecodeConfig:
    """What ``bench decode`` runs."""

    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    prompt_types: tuple[str, ...] = PROMPT_TYPES
    new_tokens: int = 256
    repeats: int = 3
    waves: int = 1
    warmups: int = 1
    warmup_tokens: int = 32
    api: Api = "chat"
    temperature: float = 0.0
    timeout: float = 600.0
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise BenchError("concurrency tiers must be positive integers, e.g. 1,2,4,8,16")
        if self.new_tokens < 2:
            raise BenchError("--output-len must be at least 2 (decode speed needs two tokens)")
        if self.repeats < 1 or self.waves < 1 or self.warmups < 0:
            raise BenchError("--repeats and --waves must be at least 1, --warmups at least 0")
        check_api(self.api)


@dataclass(frozen=True)
class ExactLength:
    """Whether the engine generates exactly the asked number of tokens, and how it was asked."""

    enforced: bool
    params: tuple[str, ...]  # which of min_tokens / ignore_eos are sent
    note: str


@dataclass(frozen=True)
class DecodeTierRun:
    """One measured run of one tier."""

    prompt_type: str
    concurrency: int
    repeat: int
    records: tuple[RequestRecord, ...]
    stats: DecodeRunStats

    @property
    def tier(self) -> str:
        return decode_tier(self.prompt_type, self.concurrency)


def decode_tier(prompt_type: str, concurrency: int) -> str:
    """The stored name of a decode tier, e.g. ``prose/c4``."""
    return f"{prompt_type}/c{concurrency}"


def _spec(config: DecodeConfig, endpoint: Endpoint, prompt: str, tokens: int, exact: ExactLength) -> RequestSpec:
    return RequestSpec(
        api=config.api,
        prompt=prompt,
        max_tokens=tokens,
        min_tokens=tokens if "min_tokens" in exact.params else None,
        ignore_eos="ignore_eos" in exact.params,
        temperature=config.temperature,
        continuous_usage=endpoint.engine == "vllm",
        extra=config.extra_body,
    )


async def run_concurrent(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    specs: Sequence[RequestSpec],
    concurrency: int,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> list[RequestRecord]:
    """Send ``specs`` with at most ``concurrency`` in flight; records in the order of ``specs``."""
    sem = asyncio.Semaphore(concurrency)

    async def one(spec: RequestSpec) -> RequestRecord:
        async with sem:
            rec = await stream_request(client, endpoint.base_url, endpoint.model, spec)
        if on_done is not None:
            on_done(rec)
        return rec

    return list(await asyncio.gather(*(one(s) for s in specs)))


async def probe_exact_length(client: httpx.AsyncClient, endpoint: Endpoint, config: DecodeConfig) -> ExactLength:
    """Ask for PROBE_TOKENS tokens to a prompt that invites a one-word answer, and see what comes."""
    attempts: tuple[tuple[str, ...], ...] = (("min_tokens", "ignore_eos"), ("ignore_eos",), ())
    last_error = None
    for params in attempts:
        exact = ExactLength(True, params, "")
        spec = _spec(config, endpoint, PROBE_PROMPT, PROBE_TOKENS, exact)
        rec = await stream_request(client, endpoint.base_url, endpoint.model, spec)
        if config.api == "chat" and refuses_chat(rec.error):
            raise BenchError(f"endpoint {endpoint.base_url} cannot chat with {endpoint.model}: {rec.error} ({HINT})")
        if rec.error and rec.error.startswith("HTTP 4") and params:
            last_error = rec.error
            continue  # the engine refuses one of the knobs: try with fewer
        if not rec.ok and rec.error == NO_USAGE_ERROR:
            raise BenchError(
                f"endpoint {endpoint.base_url} ({endpoint.engine}) reports no token usage in its streams "
                "(stream_options.include_usage); sparkfleet counts tokens only from the server's usage, "
                "never from chunks — serve with vLLM, SGLang or llama.cpp's llama-server"
            )
        if not rec.ok:
            raise BenchError(f"endpoint {endpoint.base_url} failed a probe request: {rec.error}")
        if rec.completion_tokens == PROBE_TOKENS:
            return ExactLength(True, params, f"exact length enforced with {', '.join(params) or 'max_tokens'}")
        note = (
            f"{endpoint.engine} ignored {' and '.join(params) or 'max_tokens'}: asked {PROBE_TOKENS} tokens, "
            f"got {rec.completion_tokens} (finish {rec.finish_reason}); decode lengths may vary"
        )
        return ExactLength(False, params, note)
    raise BenchError(f"endpoint {endpoint.base_url} refused every probe request: {last_error}")


async def run_decode(
    endpoint: Endpoint,
    config: DecodeConfig,
    progress: Progress | None = None,
    on_run: Callable[[DecodeTierRun], None] | None = None,
    on_exact: Callable[[ExactLength], None] | None = None,
) -> list[DecodeTierRun]:
    """Run every tier; ``on_run`` sees each measured run as soon as it ends (for storage)."""
    progress = progress or NullProgress()
    limits = httpx.Limits(
        max_connections=max(config.concurrency) + 2, max_keepalive_connections=max(config.concurrency) + 2
    )
    timeout = httpx.Timeout(config.timeout, connect=10.0)
    runs: list[DecodeTierRun] = []
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=endpoint.headers()) as client:
        exact = await probe_exact_length(client, endpoint, config)
        if on_exact is not None:
            on_exact(exact)
        for kind in config.prompt_types:
            for conc in config.concurrency:
                n = conc * config.waves
                tier = decode_tier(kind, conc)
                for w in range(config.warmups):
                    specs = [
                        _spec(config, endpoint, decode_prompt(kind, i + conc), config.warmup_tokens, exact)
                        for i in range(conc)
                    ]
                    progress.start(f"{tier} warm-up {w + 1}", len(specs))
                    recs = await run_concurrent(client, endpoint, specs, conc, progress.advance)
                    progress.finish(None)
                    _raise_if_all_failed(endpoint, tier, recs)
                for rep in range(config.repeats):
                    specs = [
                        _spec(config, endpoint, decode_prompt(kind, i), config.new_tokens, exact) for i in range(n)
                    ]
                    progress.start(f"{tier} run {rep + 1}/{config.repeats}", n)
                    recs = await run_concurrent(client, endpoint, specs, conc, progress.advance)
                    stats = decode_run_stats(recs, conc, config.new_tokens)
                    run = DecodeTierRun(kind, conc, rep, tuple(recs), stats)
                    runs.append(run)
                    if on_run is not None:
                        on_run(run)
                    progress.finish(
                        f"{tier} run {rep + 1}: {_fmt(stats.steady_tps)} tok/s aggregate, "
                        f"{_fmt(stats.per_stream_tps)} per stream, TTFT p50 {_fmt(stats.ttft.p50)} ms"
                        + (f", {stats.failed} failed" if stats.failed else "")
                    )
                    _raise_if_all_failed(endpoint, tier, recs)
    return runs


def _raise_if_all_failed(endpoint: Endpoint, tier: str, records: Sequence[RequestRecord]) -> None:
    if records and not any(r.ok for r in records):
        raise BenchError(f"endpoint {endpoint.base_url}: every request of {tier} failed: {records[0].error}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
