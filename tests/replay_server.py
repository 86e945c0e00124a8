"""A small OpenAI-compatible SSE server with exact, scripted timing, for testing the bench client.

It speaks real HTTP/1.1 (keep-alive, chunked transfer) on a real socket, so the client under test
runs unchanged. What it streams is scripted: a prefill delay, then tokens at a fixed interval,
``tokens_per_chunk`` at a time, then a usage chunk — exactly the shape vLLM sends. Prompt tokens
are ``len(prompt) // 4`` and the prefill delay is ``base_ttft + prompt_tokens / prefill_rate``,
so prefill arithmetic can be checked against known numbers. A prompt whose first 64 characters
were seen before reports them as cached tokens, like a prefix cache would.

``GET /metrics`` answers Prometheus text the way vLLM names it: ``vllm:num_requests_running`` is
the number of completions being streamed right now — the bench's and anyone else's — so a test
that sends its own requests beside the bench's injects real foreign traffic; the KV-cache gauge,
prefix-cache counters and the time-per-output-token histogram's sum and count follow the script.

Use ``ReplayServer(script).running()`` in tests (a thread with its own event loop), or run it as a
process: ``python tests/replay_server.py --port 0`` prints ``PORT <n>`` and serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Script:
    """How the server answers one completion request."""

    base_ttft: float = 0.05  # seconds before the first token, on top of the prefill time
    prefill_rate: float | None = None  # prompt tokens per second; None = no prefill time
    itl: float = 0.01  # seconds between chunks after the first
    tokens: int | None = None  # tokens to generate; None = the request's max_tokens
    tokens_per_chunk: int = 1
    stop_early_at: int | None = None  # finish with "stop" after this many tokens (no ignore_eos)
    honour_min_tokens: bool = True  # when False, min_tokens/ignore_eos are ignored like some engines
    role_chunk: bool = True  # chat: an empty role chunk first, at once (vLLM sends it with token 1)
    role_chunk_delay: float | None = None  # send the role chunk this early instead
    send_usage: bool = True
    status: int = 200  # anything else: answer with this HTTP error
    max_model_len: int = 32768
    model: str = "replay-model"
    owned_by: str = "replay"
    tokenize: bool = True  # False: no /tokenize route, like servers without one
    metrics: bool = True  # False: no /metrics route
    pattern: tuple[str, ...] = ()  # token i's text is pattern[i % len] (a loop, for the gateway); () = " t{i}"
    props: dict[str, Any] | None = None  # GET /props answers this (llama-server's route), when set
    error_body: Any = None  # the body of a scripted failure (default: an OpenAI error object)


def prompt_text(body: dict[str, Any]) -> str:
    """The prompt of a chat or completions body."""
    if "messages" in body:
        return "".join(str(m.get("content", "")) for m in body["messages"])
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


class ReplayServer:
    """The server; ``script`` may be replaced between requests, or be a function of the body."""

    def __init__(self, script: Script | Callable[[dict[str, Any]], Script] | None = None) -> None:
        self.script = script or Script()
        self.seen_prefixes: set[str] = set()
        self.bodies: list[dict[str, Any]] = []
        self.arrived: list[float] = []  # perf_counter() at which each completion request was read
        self.open_streams = 0  # completions being streamed now (not named `running`: that is the method)
        self.peak_streams = 0
        self.counters = {"prefix_hits": 0, "prefix_queries": 0, "tpot_sum": 0.0, "tpot_count": 0}
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _script_for(self, body: dict[str, Any]) -> Script:
        return self.script(body) if callable(self.script) else self.script

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                length = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(length) if length else b""
                await self._route(method, path, raw, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _route(self, method: str, path: str, raw: bytes, writer: asyncio.StreamWriter) -> None:
        script = self.script if not callable(self.script) else Script()
        if method == "GET" and path == "/v1/models":
            card = {
                "id": script.model,
                "object": "model",
                "owned_by": script.owned_by,
                "max_model_len": script.max_model_len,
            }
            await self._json(writer, 200, {"object": "list", "data": [card]})
        elif method == "GET" and path == "/version":
            await self._json(writer, 200, {"version": "replay-1"})
        elif method == "GET" and path == "/metrics" and script.metrics:
            await self._text(writer, 200, self.prometheus())
        elif method == "GET" and path == "/props" and script.props is not None:
            await self._json(writer, 200, script.props)
        elif method == "GET" and path == "/health":
            await self._json(writer, 200, {})
        elif method == "POST" and path == "/tokenize" and script.tokenize:
            body = json.loads(raw or b"{}")
            n = len(prompt_text(body)) // 4
            await self._json(writer, 200, {"count": n, "max_model_len": script.max_model_len, "tokens": list(range(n))})
        elif method == "POST" and path == "/v1/embeddings":
            body = json.loads(raw or b"{}")
            texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
            data = [{"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0]} for i, t in enumerate(texts)]
            n = sum(len(t) // 4 for t in texts)
            await self._json(writer, 200, {"object": "list", "data": data, "model": script.model,
                                           "usage": {"prompt_tokens": n, "total_tokens": n}})  # fmt: skip
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            self.arrived.append(time.perf_counter())
            body = json.loads(raw or b"{}")
            self.bodies.append(body)
            await self._complete(writer, body, chat=path.endswith("chat/completions"))
        else:
            await self._json(writer, 404, {"error": {"message": f"no route {method} {path}"}})

    async def _json(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        await self._text(writer, status, json.dumps(obj), "application/json")

    async def _text(self, writer: asyncio.StreamWriter, status: int, text: str, kind: str = "text/plain") -> None:
        data = text.encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\n".encode()
            + f"content-length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    def prometheus(self) -> str:
        """The engine's gauges and counters now, in vLLM's names and label style."""
        labels = '{model_name="replay-model",engine="0"}'
        c = self.counters
        return "".join(
            f"# TYPE {name} {kind}\n{name}{labels} {value}\n"
            for name, kind, value in (
                ("vllm:num_requests_running", "gauge", float(self.open_streams)),
                ("vllm:num_requests_waiting", "gauge", 0.0),
                ("vllm:kv_cache_usage_perc", "gauge", min(1.0, 0.01 * self.open_streams)),
                ("vllm:prefix_cache_hits_total", "counter", float(c["prefix_hits"])),
                ("vllm:prefix_cache_queries_total", "counter", float(c["prefix_queries"])),
                ("vllm:request_time_per_output_token_seconds_sum", "histogram", float(c["tpot_sum"])),
                ("vllm:request_time_per_output_token_seconds_count", "histogram", float(c["tpot_count"])),
            )
        )

    async def _complete(self, writer: asyncio.StreamWriter, body: dict[str, Any], chat: bool) -> None:
        self.open_streams += 1
        self.peak_streams = max(self.peak_streams, self.open_streams)
        try:
            await self._stream(writer, body, chat)
        finally:
            self.open_streams -= 1

    async def _stream(self, writer: asyncio.StreamWriter, body: dict[str, Any], chat: bool) -> None:
        script = self._script_for(body)
        if script.status != 200:
            failure = script.error_body if script.error_body is not None else {"error": {"message": "scripted failure"}}
            await self._json(writer, script.status, failure)
            return
        prompt = prompt_text(body)
        prompt_tokens = len(prompt) // 4
        key = prompt[:64]
        cached = 64 // 4 if key in self.seen_prefixes else 0
        self.seen_prefixes.add(key)
        self.counters["prefix_queries"] += prompt_tokens
        self.counters["prefix_hits"] += cached
        n = script.tokens if script.tokens is not None else int(body.get("max_tokens", 16))
        if script.stop_early_at is not None and not (script.honour_min_tokens and body.get("ignore_eos")):
            n = min(n, script.stop_early_at)
        prefill = (prompt_tokens - cached) / script.prefill_rate if script.prefill_rate else 0.0
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def at(offset: float) -> None:
            delay = t0 + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)

        def send(obj: Any) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))

        def usage(done: int) -> dict[str, Any]:
            return {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": done,
                "total_tokens": prompt_tokens + done,
                "prompt_tokens_details": {"cached_tokens": cached},
            }

        base = {
            "id": "cmpl-replay",
            "created": 0,
            "model": script.model,
            "object": "chat.completion.chunk" if chat else "text_completion",
        }
        first = script.base_ttft + prefill
        if chat and script.role_chunk:
            if script.role_chunk_delay is not None:
                await at(script.role_chunk_delay)
            else:
                await at(first)
            send({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        done = 0
        i = 0
        while done < n:
            k = min(script.tokens_per_chunk, n - done)
            await at(first + i * script.itl)
            done += k
            piece = "".join(_token(script, done - k + j) for j in range(k))
            reason = ("length" if n == int(body.get("max_tokens", n)) else "stop") if done == n else None
            choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
            if chat:
                choice["delta"] = {"content": piece}
            else:
                choice["text"] = piece
            chunk = {**base, "choices": [choice]}
            if continuous:
                chunk["usage"] = usage(done)
            send(chunk)
            await writer.drain()
            i += 1
        if done > 1:
            self.counters["tpot_sum"] += script.itl * (i - 1) / (done - 1)
            self.counters["tpot_count"] += 1
        if script.send_usage:
            send({**base, "choices": [], "usage": usage(done)})
        send(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    @contextmanager
    def running(self, port: int = 0) -> Iterator[ReplayServer]:
        """Serve from a background thread for the duration of the block (on ``port``, 0: any)."""
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.run_until_complete(self.start(port))
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        started.wait(10)
        try:
            yield self
        finally:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join(10)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        # Connections still open end here, while the loop runs: left to the garbage collector, their
        # handlers closed their writers on a closed loop (pytest's unraisable-exception warnings).
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


def _token(script: Script, i: int) -> str:
    return script.pattern[i % len(script.pattern)] if script.pattern else f" t{i}"


class BlastServer(ReplayServer):
    """No timing at all: the whole answer is pre-rendered and written in one go (for overhead)."""

    async def _complete(self, writer: asyncio.StreamWriter, body: dict[str, Any], chat: bool) -> None:
        script = self._script_for(body)
        n = script.tokens if script.tokens is not None else int(body.get("max_tokens", 16))
        payload = _blast_payload(n, chat, script.model)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(payload)
        await writer.drain()


class TickServer(ReplayServer):
    """Exact timing at high concurrency: the whole answer pre-rendered, and one clock that every
    ``itl`` writes each stream's due events (token i is due at ``base_ttft + i * itl``; the usage
    event and [DONE] go with the last token). The replay server's sleep, JSON and drain per event
    cost about 40 µs: at 64 streams of 1,000 events/s that alone is more than this machine's two
    cores, and the timing it was meant to hold is lost."""

    def __init__(self, script: Script | Callable[[dict[str, Any]], Script] | None = None) -> None:
        super().__init__(script)
        self._streams: list[list[Any]] = []  # [t0, next index, writer, events, done future]
        self._clock: asyncio.Task[None] | None = None

    async def _complete(self, writer: asyncio.StreamWriter, body: dict[str, Any], chat: bool) -> None:
        script = self._script_for(body)
        n = script.tokens if script.tokens is not None else int(body.get("max_tokens", 16))
        events = _tick_events(n, chat, script.model)
        loop = asyncio.get_running_loop()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        done: asyncio.Future[None] = loop.create_future()
        self._streams.append([loop.time() + script.base_ttft, 0, writer, events, done])
        if self._clock is None or self._clock.done():
            self._clock = asyncio.ensure_future(self._tick(script.itl))
        await done
        await writer.drain()

    async def _tick(self, itl: float) -> None:
        loop = asyncio.get_running_loop()
        while self._streams:
            now = loop.time()
            for stream in self._streams:
                t0, i, writer, events, done = stream
                due = min(len(events), int((now - t0) / itl) + 1) if now >= t0 else 0
                if due > i:
                    writer.write(b"".join(events[i:due]) if due - i > 1 else events[i])
                    stream[1] = due
                    if due == len(events):
                        done.set_result(None)
            self._streams = [s for s in self._streams if not s[4].done()]
            await asyncio.sleep(itl - (loop.time() - now) % itl)


def _tick_events(n: int, chat: bool, model: str) -> list[bytes]:
    """The chunked-framed events of an n-token answer, the last one carrying usage, [DONE] and the
    end of the chunked body."""
    payload = _blast_payload(n, chat, model)
    events, pos = [], 0
    while pos < len(payload):
        size_end = payload.index(b"\r\n", pos)
        size = int(payload[pos:size_end], 16)
        end = size_end + 2 + size + 2
        events.append(payload[pos:end])
        pos = end
    # events: n tokens, usage, [DONE], the terminator: the last token's slot carries the rest
    return [*events[: n - 1], b"".join(events[n - 1 :])]


_BLAST_CACHE: dict[tuple[int, bool, str], bytes] = {}


def _blast_payload(n: int, chat: bool, model: str) -> bytes:
    key = (n, chat, model)
    if key not in _BLAST_CACHE:
        parts = []
        obj = "chat.completion.chunk" if chat else "text_completion"
        for i in range(n):
            piece = f" tok{i}"
            choice = (
                {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}
                if chat
                else {"index": 0, "text": piece, "logprobs": None, "finish_reason": None}
            )
            parts.append(
                {
                    "id": "chatcmpl-0123456789abcdef",
                    "object": obj,
                    "created": 1764400000,
                    "model": model,
                    "choices": [choice],
                }
            )
        parts.append(
            {
                "id": "x",
                "object": obj,
                "created": 0,
                "model": model,
                "choices": [],
                "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": n + 10},
            }
        )
        events = [b"data: " + json.dumps(p).encode() + b"\n\n" for p in parts] + [b"data: [DONE]\n\n"]
        # One HTTP chunk per SSE event, as real servers send them.
        _BLAST_CACHE[key] = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    return _BLAST_CACHE[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--blast", action="store_true", help="no timing: stream as fast as possible")
    parser.add_argument("--tick", action="store_true", help="pre-rendered answers paced by one clock (many streams)")
    parser.add_argument("--itl", type=float, default=0.01)
    parser.add_argument("--ttft", type=float, default=0.05)
    parser.add_argument(
        "--tokens", type=int, default=None, help="tokens per answer (default: the request's max_tokens)"
    )
    args = parser.parse_args()

    async def run() -> None:
        cls = BlastServer if args.blast else TickServer if args.tick else ReplayServer
        server = cls(replace(Script(), itl=args.itl, base_ttft=args.ttft, tokens=args.tokens))
        await server.start(args.port)
        print(f"PORT {server.port}", flush=True)
        await asyncio.Event().wait()

    try:  # uvloop where installed: the per-event cost is mostly the loop's
        import uvloop
    except ImportError:
        asyncio.run(run())
    else:
        uvloop.run(run())


if __name__ == "__main__":
    main()
