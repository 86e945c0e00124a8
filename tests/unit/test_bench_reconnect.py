"""A pooled connection the server closed (llama-server does, after a few kept-alive requests) is
retried once on a new one; a failure after the server answered is never retried."""

from __future__ import annotations

import asyncio
import json

import httpx

from sparkfleet.bench.client import RequestSpec, stream_request

FINAL = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}],
         "usage": {"completion_tokens": 2, "prompt_tokens": 3, "total_tokens": 5}}  # fmt: skip
BODY = (b'data: {"choices":[{"text":" 42","index":0,"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"text":" 42","index":0,"finish_reason":null}]}\n\n'
        b"data: " + json.dumps(FINAL).encode() + b"\n\ndata: [DONE]\n\n")  # fmt: skip
SPEC = RequestSpec(api="completions", prompt="The answer is 42", max_tokens=2)


def _send(handler: object) -> object:
    async def go() -> object:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:  # type: ignore[arg-type]
            return await stream_request(client, "http://x", "m", SPEC)

    return asyncio.run(go())


def test_a_connection_closed_before_any_answer_is_retried_once() -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return httpx.Response(200, stream=httpx.ByteStream(BODY), headers={"content-type": "text/event-stream"})

    rec = _send(handler)
    assert len(calls) == 2
    assert rec.ok and rec.completion_tokens == 2 and rec.text == " 42 42"  # type: ignore[attr-defined]


def test_twice_closed_is_a_recorded_failure_not_a_loop() -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)

    rec = _send(handler)
    assert len(calls) == 2
    assert not rec.ok and "Server disconnected" in (rec.error or "")  # type: ignore[attr-defined]


def test_a_stream_broken_after_the_answer_began_is_not_sent_again() -> None:
    calls: list[int] = []

    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[no-untyped-def]
            yield BODY[:40]
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, stream=Broken(), headers={"content-type": "text/event-stream"})

    rec = _send(handler)
    assert len(calls) == 1
    assert not rec.ok and "peer closed" in (rec.error or "")  # type: ignore[attr-defined]
