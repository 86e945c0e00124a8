"""The gateway reads most streamed events without parsing them (stream.Watch._like_last):
what it forwards, counts, logs and stops on must be exactly what a full parse of every event gives,
for every engine's spelling of an event (key order, spaces, ASCII escapes) and every kind of event
(usage, finish reasons, logprobs, reasoning, tool calls, several choices)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkfleet.gateway.config import LoopAbort
from sparkfleet.gateway.stream import Watch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llama-server-h200"


class ParseEveryEvent(Watch):
    """The reference: every event through the JSON parser."""

    def _like_last(self, payload: bytes) -> tuple[str, int] | None:
        return None


def state(w: Watch) -> dict[str, Any]:
    return {"usage": w.usage, "finish": w.finish_reason, "pieces": w.pieces, "aborted": w.aborted,
            "done": w.done, "template": w.template, "text": w.text}  # fmt: skip


def run(cls: type[Watch], events: bytes, chat: bool, loop: LoopAbort) -> tuple[bytes, dict[str, Any]]:
    w = cls(chat=chat, loop=loop, drop_usage=True, text=[])
    return w.feed(events), state(w)


def both(events: bytes, chat: bool = True, loop: LoopAbort | None = None) -> tuple[bytes, dict[str, Any]]:
    loop = loop or LoopAbort()
    fast = run(Watch, events, chat, loop)
    assert fast == run(ParseEveryEvent, events, chat, loop)
    return fast


texts = st.text(st.characters(codec="utf-8"), max_size=12)
spellings = st.sampled_from([(",", ":"), (", ", ": "), (",", " : ")])  # pydantic / llama-server, json.dumps, odd


@st.composite
def event(draw: st.DrawFn, chat: bool) -> dict[str, Any]:
    n = draw(st.sampled_from([1, 1, 1, 1, 2, 0]))
    choices = []
    for index in range(n):
        choice: dict[str, Any] = {"index": index}
        if chat:
            delta: dict[str, Any] = {}
            if draw(st.booleans()):
                delta["role"] = "assistant"
            delta["content"] = draw(st.one_of(texts, st.none()))
            if draw(st.integers(0, 9)) == 0:
                delta["reasoning_content"] = draw(texts)
            if draw(st.integers(0, 9)) == 0:
                delta["tool_calls"] = [{"index": 0, "function": {"name": "f", "arguments": draw(texts)}}]
            choice["delta"] = delta
        else:
            choice["text"] = draw(texts)
        if draw(st.integers(0, 9)) == 0:
            choice["logprobs"] = {"content": [{"token": "x", "logprob": -0.1}]}
        elif draw(st.booleans()):
            choice["logprobs"] = None
        choice["finish_reason"] = draw(st.sampled_from([None, None, None, "stop", "length"]))
        choices.append(choice)
    obj: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                           "choices": choices}  # fmt: skip
    usage = draw(st.sampled_from(["absent", "null", "absent", "object"]))
    if usage == "null":
        obj["usage"] = None
    elif usage == "object":
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": draw(st.integers(0, 99)), "total_tokens": 9}
    keys = draw(st.permutations(list(obj)))
    return {k: obj[k] for k in keys}


def with_text(e: dict[str, Any], chat: bool, text: str | None) -> dict[str, Any]:
    """The same event with another text (the engines' usual next event)."""
    e = json.loads(json.dumps(e))
    for choice in e["choices"]:
        if chat:
            choice["delta"]["content"] = text
        else:
            choice["text"] = text
    return e


@st.composite
def stream(draw: st.DrawFn) -> tuple[bool, bytes]:
    """Runs of events that differ only in their text, broken now and then by any other event."""
    chat = draw(st.booleans())
    sep = draw(spellings)
    ascii_only = draw(st.booleans())
    events: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 6))):
        base = draw(event(chat))
        events.append(base)
        events += [with_text(base, chat, t) for t in draw(st.lists(st.one_of(texts, st.none()), max_size=8))]
    body = b"".join(b"data: " + json.dumps(e, separators=sep, ensure_ascii=ascii_only).encode() + b"\n\n"
                    for e in events)  # fmt: skip
    return chat, body + (b"data: [DONE]\n\n" if draw(st.booleans()) else b"")


@settings(max_examples=400, deadline=None)
@given(stream())
def test_reading_without_parsing_equals_parsing_every_event(case: tuple[bool, bytes]) -> None:
    chat, body = case
    both(body, chat)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", " the", "\n", "é"]), min_size=40, max_size=300), spellings)
def test_the_loop_abort_stops_at_the_same_event_either_way(pieces: list[str], sep: tuple[str, str]) -> None:
    events = [{"id": "c", "model": "m", "created": 1, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]  # fmt: skip
    body = b"".join(b"data: " + json.dumps(e, separators=sep, ensure_ascii=False).encode() + b"\n\n" for e in events)
    out, got = both(body, True, LoopAbort(ngram=4, repeats=3, token_repeats=8, line_repeats=3))
    if got["aborted"]:
        assert out.endswith(b"data: [DONE]\n\n")


def test_a_real_llama_server_stream_reads_the_same_and_mostly_without_a_parse() -> None:
    body = (FIXTURES / "chat-stream.sse").read_bytes()
    out, got = both(body, True, LoopAbort(token_repeats=0, ngram=0, line_repeats=0))
    assert out == body and got["pieces"] == got["usage"]["completion_tokens"] == 8

    parsed = 0

    class Counting(Watch):
        def _like_last(self, payload: bytes) -> tuple[str, int] | None:
            nonlocal parsed
            like = super()._like_last(payload)
            parsed += like is None
            return like

    w = Counting(chat=True, loop=LoopAbort(), drop_usage=False)
    w.feed(body.replace(b'"\\n"', b'"x"'))  # this random model's tokens are newlines (escaped)
    # parsed: the first event, the one where `created` turned to the next second, the last (finish, usage)
    assert parsed == 3, parsed
