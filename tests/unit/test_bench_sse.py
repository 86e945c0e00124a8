"""The SSE parser on streams shaped like vLLM's, llama.cpp's and SGLang's, cut at every byte."""

from __future__ import annotations

import json

import pytest

from sparkfleet.bench.client import RequestSpec, _StreamParser, request_body


def sse(*events: object) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}


def content(text: str, reason: str | None = None, **delta: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text, **delta}, "finish_reason": reason}]}


USAGE = {
    "choices": [],
    "usage": {
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 0},
    },
}
CHAT = sse(ROLE, content("Hello"), content(" world"), content("!", "length"), USAGE, b"[DONE]")


def feed_timed(stream: bytes, pieces: list[tuple[bytes, float]]) -> _StreamParser:
    parser = _StreamParser("chat")
    for data, t in pieces:
        parser.feed(data, t)
    return parser


def test_role_chunk_is_not_the_first_token() -> None:
    # The role chunk arrives at t=1, tokens at t=2, 3, 4: TTFR 1 s, TTFT 2 s.
    events = CHAT.split(b"\n\n")[:-1]
    pieces = [(e + b"\n\n", t) for e, t in zip(events, (1.0, 2.0, 3.0, 4.0, 4.0, 4.0), strict=True)]
    rec = feed_timed(CHAT, pieces).record(0.0, 4.5)
    assert rec.ttfr == 1.0
    assert rec.ttft == 2.0
    assert rec.chunk_times == (2.0, 3.0, 4.0)
    assert rec.end == 4.0
    assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (12, 3, 0)
    assert rec.finish_reason == "length"
    assert rec.text == "Hello world!"
    assert rec.ok


@pytest.mark.parametrize("cut", range(1, len(CHAT)))
def test_any_split_of_the_byte_stream_parses_the_same(cut: int) -> None:
    parser = _StreamParser("chat")
    parser.feed(CHAT[:cut], 1.0)
    parser.feed(CHAT[cut:], 1.0)
    rec = parser.record(0.0, 1.0)
    assert rec.completion_tokens == 3
    assert len(rec.chunk_times) == 3
    assert rec.text == "Hello world!"


def test_reasoning_counts_as_generated_output() -> None:
    stream = sse(ROLE, {"choices": [{"index": 0, "delta": {"reasoning_content": "Hmm"}}]}, content("ok", "stop"), USAGE)
    parser = _StreamParser("chat")
    parser.feed(stream[: stream.index(b"Hmm") + 10], 1.0)
    parser.feed(stream[stream.index(b"Hmm") + 10 :], 2.0)
    rec = parser.record(0.0, 2.0)
    assert rec.ttft == 1.0
    assert rec.text.startswith("Hmm")


def test_chunk_count_never_stands_in_for_usage() -> None:
    rec = feed_timed(b"", [(sse(ROLE, content("a"), content("b"), b"[DONE]"), 1.0)]).record(0.0, 1.0)
    assert rec.completion_tokens is None
    assert not rec.ok
    assert "no usage" in (rec.error or "")


def test_error_event_inside_the_stream_is_recorded() -> None:
    stream = sse(ROLE, content("a"), {"error": {"message": "out of KV cache", "code": 500}})
    rec = feed_timed(stream, [(stream, 1.0)]).record(0.0, 1.0)
    assert rec.error == "server error in stream: out of KV cache"
    assert not rec.ok


def test_running_usage_gives_tokens_per_chunk() -> None:
    def chunk(text: str, done: int) -> dict[str, object]:
        return {**content(text), "usage": {"prompt_tokens": 5, "completion_tokens": done}}

    stream = sse(
        {**ROLE, "usage": {"prompt_tokens": 5, "completion_tokens": 0}},
        chunk("ab", 2),
        chunk("c", 3),
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}},
    )
    rec = feed_timed(stream, [(stream, 1.0)]).record(0.0, 1.0)
    assert rec.chunk_tokens == (2, 1)
    assert rec.completion_tokens == 3


def test_completions_stream_and_max_tokens_one_with_empty_text() -> None:
    parser = _StreamParser("completions")
    stream = sse(
        {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 4000, "completion_tokens": 1}},
        b"[DONE]",
    )
    parser.feed(stream, 0.75)
    rec = parser.record(0.25, 0.8)
    # The only generated token had no text: the chunk that finished it marks TTFT.
    assert rec.ttft == pytest.approx(0.5)
    assert rec.ok


def test_llama_cpp_comment_lines_and_crlf_are_ignored() -> None:
    stream = b": ping\r\n\r\n" + sse(content("x", "stop")).replace(b"\n", b"\r\n") + sse(USAGE)
    rec = feed_timed(stream, [(stream, 1.0)]).record(0.0, 1.0)
    assert rec.text == "x"
    assert rec.completion_tokens == 3


def test_request_body_asks_usage_in_the_stream_and_exact_length() -> None:
    spec = RequestSpec(
        api="chat",
        prompt="hi",
        max_tokens=256,
        min_tokens=256,
        ignore_eos=True,
        continuous_usage=True,
        extra={"top_p": 1},
    )
    body = request_body(spec, "m")
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert (body["max_tokens"], body["min_tokens"], body["ignore_eos"]) == (256, 256, True)
    assert body["temperature"] == 0.0
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["top_p"] == 1
    plain = request_body(RequestSpec(api="completions", prompt="p", max_tokens=1), "m")
    assert "min_tokens" not in plain and "ignore_eos" not in plain and plain["prompt"] == "p"
