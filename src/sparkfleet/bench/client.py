"""Async streaming client for OpenAI-compatible servers: one request, every chunk timestamped.

Token counts come only from the server's ``usage`` (asked for in the stream with
``stream_options.include_usage``), never from the number of chunks: one chunk may carry several
tokens (speculative decoding, detokenizer batching) or none (an incomplete UTF-8 sequence).

llama.cpp's ``llama-server`` sends ``usage`` in the stream's final chunk, the one that carries
``finish_reason`` with an empty text or delta (not OpenAI's separate chunk with no choices), and
its own ``timings`` beside it (``predicted_per_second``, ``prompt_per_second``, …): both are
read from whichever chunk holds them, and the timings are kept so the bench's figures can be
checked against the server's.

Times are ``time.perf_counter()`` seconds. A record keeps its absolute send time (``start``) and
every other time relative to it, so records of concurrent requests can be laid on one time line.
All events parsed from one network read share the time of that read: that is when the client
saw them, and it keeps the per-event cost to one ``json.loads``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from sparkfleet.errors import BenchError

Api = Literal["chat", "completions"]


def check_api(api: str) -> None:
    """BenchError unless api is one of ``Api``'s (what ``--api`` takes)."""
    if api not in ("chat", "completions"):
        raise BenchError(f"--api must be chat or completions, not {api!r}")


# Kept short so that a stored run of c16 x 256 tokens stays small; the text is for eyeballing.
TEXT_KEEP_CHARS = 2000
NO_USAGE_ERROR = "the server reported no usage (stream_options.include_usage unsupported?)"


@dataclass(frozen=True)
class RequestSpec:
    """What to send: one prompt, a token budget and the knobs that force an exact length."""

    api: Api
    prompt: str
    max_tokens: int
    min_tokens: int | None = None
    ignore_eos: bool = False
    temperature: float = 0.0
    continuous_usage: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Chat only: the whole conversation (system prompt, earlier turns); None = one user message.
    messages: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request; times in seconds, relative to ``start`` unless noted.

    ``ttfr``: first SSE data of any kind (the role chunk counts). ``ttft``: first chunk carrying
    generated text, reasoning or a tool call; when the only generated token has empty text (it
    happens with ``max_tokens`` 1), the chunk that finished the choice. ``chunk_times``: the
    content chunks. ``chunk_tokens``: tokens per content chunk when the server reported running
    usage (vLLM ``continuous_usage_stats``), else None. ``end``: the last content chunk (vLLM's
    E2EL). ``done``: the end of the stream. ``server_timings``: the engine's own account of the
    request when it sends one (llama.cpp's ``timings``: ``predicted_per_second``, ``prompt_n``, …).
    """

    start: float
    ttfr: float | None
    ttft: float | None
    chunk_times: tuple[float, ...]
    chunk_tokens: tuple[int, ...] | None
    end: float | None
    done: float
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    finish_reason: str | None
    error: str | None
    text: str = ""
    server_timings: Mapping[str, float] | None = None

    @property
    def ok(self) -> bool:
        """Completed without error, with usage reported and at least one generated chunk."""
        return self.error is None and self.completion_tokens is not None and self.ttft is not None

    def to_json(self) -> dict[str, Any]:
        """A plain dict for storage; ``from_json`` reads it back."""
        return {
            "start": self.start,
            "ttfr": self.ttfr,
            "ttft": self.ttft,
            "chunk_times": list(self.chunk_times),
            "chunk_tokens": list(self.chunk_tokens) if self.chunk_tokens is not None else None,
            "end": self.end,
            "done": self.done,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "text": self.text,
            "server_timings": dict(self.server_timings) if self.server_timings is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestRecord:
        """Inverse of ``to_json``."""
        tokens = data.get("chunk_tokens")
        timings = data.get("server_timings")
        return cls(
            start=float(data["start"]),
            ttfr=data.get("ttfr"),
            ttft=data.get("ttft"),
            chunk_times=tuple(data.get("chunk_times") or ()),
            chunk_tokens=tuple(tokens) if tokens is not None else None,
            end=data.get("end"),
            done=float(data.get("done") or 0.0),
            prompt_tokens=data.get("prompt_tokens"),
            completion_tokens=data.get("completion_tokens"),
            cached_tokens=data.get("cached_tokens"),
            finish_reason=data.get("finish_reason"),
            error=data.get("error"),
            text=data.get("text") or "",
            server_timings=dict(timings) if isinstance(timings, Mapping) else None,
        )


def request_body(spec: RequestSpec, model: str) -> dict[str, Any]:
    """The JSON body for ``spec``: streaming, usage in the stream, greedy unless told."""
    stream_options: dict[str, Any] = {"include_usage": True}
    if spec.continuous_usage:
        stream_options["continuous_usage_stats"] = True
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "stream": True,
        "stream_options": stream_options,
    }
    if spec.api == "chat":
        body["messages"] = (
            [dict(m) for m in spec.messages] if spec.messages else [{"role": "user", "content": spec.prompt}]
        )
    else:
        body["prompt"] = spec.prompt
    if spec.min_tokens is not None:
        body["min_tokens"] = spec.min_tokens
    if spec.ignore_eos:
        body["ignore_eos"] = True
    body.update(spec.extra)
    return body


def api_path(api: Api) -> str:
    """The URL path of an API kind."""
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


class _StreamParser:
    """Turns SSE bytes into the fields of a RequestRecord; fed with (bytes, time) pairs."""

    __slots__ = (
        "api",
        "buf",
        "cached_tokens",
        "chunk_times",
        "chunk_tokens",
        "completion_tokens",
        "done",
        "error",
        "finish_reason",
        "finish_time",
        "last_usage_tokens",
        "prompt_tokens",
        "server_timings",
        "text",
        "text_len",
        "ttfr",
        "usage_per_chunk",
    )

    def __init__(self, api: Api) -> None:
        self.api = api
        self.buf = b""
        self.ttfr: float | None = None
        self.chunk_times: list[float] = []
        self.chunk_tokens: list[int] = []
        self.usage_per_chunk = True
        self.last_usage_tokens = 0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.finish_reason: str | None = None
        self.finish_time: float | None = None
        self.error: str | None = None
        self.server_timings: dict[str, float] | None = None
        self.text: list[str] = []
        self.text_len = 0
        self.done = False

    def feed(self, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        lines = buf.split(b"\n")
        self.buf = lines.pop()
        for line in lines:
            if line[:5] != b"data:":
                continue  # blank separators, comments (": ping"), event: lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            if self.ttfr is None:
                self.ttfr = now
            self._event(payload, now)

    def _event(self, payload: bytes, now: float) -> None:
        try:
            obj = json.loads(payload)
        except ValueError:
            self.error = f"unparsable stream event: {payload[:120]!r}"
            return
        if not isinstance(obj, dict):
            return
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            self.error = f"server error in stream: {msg}"
            return
        usage = obj.get("usage")
        timings = obj.get("timings")
        if isinstance(timings, dict):
            self.server_timings = server_timings(timings)
        content = False
        for choice in obj.get("choices") or ():
            if self.api == "chat":
                delta = choice.get("delta") or {}
                piece = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                if piece or delta.get("tool_calls"):
                    content = True
                    if piece and self.text_len < TEXT_KEEP_CHARS:
                        self.text.append(piece)
                        self.text_len += len(piece)
            else:
                piece = choice.get("text")
                if piece:
                    content = True
                    if self.text_len < TEXT_KEEP_CHARS:
                        self.text.append(piece)
                        self.text_len += len(piece)
            reason = choice.get("finish_reason")
            if reason:
                self.finish_reason = reason
                if self.finish_time is None:
                    self.finish_time = now
        if usage:
            done_tokens = usage.get("completion_tokens")
            if content:
                if done_tokens is None:
                    self.usage_per_chunk = False
                else:
                    self.chunk_tokens.append(done_tokens - self.last_usage_tokens)
            if done_tokens is not None:
                self.last_usage_tokens = done_tokens
                self.completion_tokens = done_tokens
            if usage.get("prompt_tokens") is not None:
                self.prompt_tokens = usage["prompt_tokens"]
            details = usage.get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            if cached is not None:
                self.cached_tokens = cached
        elif content:
            self.usage_per_chunk = False
        if content:
            self.chunk_times.append(now)

    def record(self, start: float, done: float) -> RequestRecord:
        times = tuple(t - start for t in self.chunk_times)
        ttft: float | None = times[0] if times else None
        if ttft is None and self.finish_time is not None and self.error is None:
            ttft = self.finish_time - start
        per_chunk = (
            tuple(self.chunk_tokens)
            if self.usage_per_chunk and times and len(self.chunk_tokens) == len(times)
            else None
        )
        error = self.error
        if error is None and self.completion_tokens is None:
            error = NO_USAGE_ERROR
        return RequestRecord(
            start=start,
            ttfr=self.ttfr - start if self.ttfr is not None else None,
            ttft=ttft,
            chunk_times=times,
            chunk_tokens=per_chunk,
            end=times[-1] if times else ttft,
            done=done - start,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            finish_reason=self.finish_reason,
            error=error,
            text="".join(self.text)[:TEXT_KEEP_CHARS],
            server_timings=self.server_timings,
        )


def server_timings(timings: Mapping[str, Any]) -> dict[str, float]:
    """The numeric fields of an engine's ``timings`` object (llama.cpp: ``prompt_n``,
    ``prompt_ms``, ``prompt_per_second``, ``predicted_n``, ``predicted_ms``,
    ``predicted_per_second``, …); anything else is dropped."""
    return {str(k): float(v) for k, v in timings.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _failed(start: float, message: str) -> RequestRecord:
    now = time.perf_counter()
    return RequestRecord(
        start=start,
        ttfr=None,
        ttft=None,
        chunk_times=(),
        chunk_tokens=None,
        end=None,
        done=now - start,
        prompt_tokens=None,
        completion_tokens=None,
        cached_tokens=None,
        finish_reason=None,
        error=message,
    )


async def stream_request(client: httpx.AsyncClient, base_url: str, model: str, spec: RequestSpec) -> RequestRecord:
    """Send one streaming request and record it; failures are recorded, never raised.

    A request whose pooled connection the server had already closed is sent once more on a
    new one: llama.cpp's llama-server (cpp-httplib) closes kept-alive connections after a few
    requests, and the client only learns it when its next request gets no answer at all
    (``Server disconnected without sending a response``). That request never reached the
    server, so sending it again measures nothing twice; its clock restarts.
    """
    url = base_url.rstrip("/") + api_path(spec.api)
    body = json.dumps(request_body(spec, model)).encode()
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    clock = time.perf_counter
    for attempt in range(2):
        parser = _StreamParser(spec.api)
        start = clock()
        answered = False
        try:
            async with client.stream("POST", url, content=body, headers=headers) as response:
                answered = True
                if response.status_code != 200:
                    detail = (await response.aread()).decode(errors="replace").strip()
                    return _failed(start, f"HTTP {response.status_code}: {_short(detail)}")
                async for data in response.aiter_raw():
                    parser.feed(data, clock())
                if parser.buf:
                    parser.feed(b"\n", clock())
        except httpx.TimeoutException as exc:
            return _failed(start, f"timed out ({type(exc).__name__})")
        except httpx.RemoteProtocolError as exc:
            if not answered and attempt == 0:
                continue  # a connection the server had closed: the request never reached it
            return _failed(start, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        except httpx.HTTPError as exc:
            return _failed(start, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        return parser.record(start, clock())
    raise AssertionError("unreachable")  # pragma: no cover - the loop always returns


def _short(text: str, limit: int = 300) -> str:
    """Server error bodies can be pages of HTML; one line of it is enough."""
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            text = str(err.get("message", err)) if isinstance(err, dict) else str(err)
    except ValueError:
        pass
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
