"""The gateway as a raw ASGI application (served by uvicorn): auth, the output cap, routing, and
the streamed answer passed through with the loop detector reading its text deltas.

Raw ASGI rather than a framework: the per-chunk path is this module's ``_pump`` and uvicorn's
``send``, nothing else. Upstream requests go through one shared ``aiohttp.ClientSession``: its C
parser, and ``readany()`` handing over everything that has arrived (many events in one read when
the gateway is busy, so one ``send`` carries them all), cost far fewer CPU seconds per streamed
chunk than httpx's pure-Python h11 path, which yields one HTTP chunk at a time (figures in
docs/gateway.md). Closing a response that is not fully read closes its connection, which is how
an engine learns that the answer is no longer wanted (vLLM, SGLang and llama.cpp all free the
slot then).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from sparkfleet.gateway.config import GatewayConfig, Route
from sparkfleet.gateway.hold import HoldQueue, QueueFull, RouteGone
from sparkfleet.gateway.keys import Key, KeyStore
from sparkfleet.gateway.observe import Metrics, RequestLog, Row
from sparkfleet.gateway.routing import Replica, Router, read_deployments
from sparkfleet.gateway.stream import Assembler, Watch, last_event_end

log = logging.getLogger("sparkfleet.gateway")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}
_CAP_FIELDS = {"chat": ("max_tokens", "max_completion_tokens"), "completions": ("max_tokens",)}
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
# What an engine that fails or goes away raises (a read timeout is a TimeoutError).
_UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError)
_ANONYMOUS = Key(id="-", name="-", models=None, rpm=None, tpm=None, expires=None, created=0.0, revoked=None)


class Limiter:
    """Requests and tokens per key over the last minute, in this process's memory."""

    def __init__(self) -> None:
        self._requests: dict[str, deque[float]] = {}
        self._tokens: dict[str, deque[tuple[float, int]]] = {}

    def check(self, key: Key, now: float) -> float | None:
        """Seconds until the key may send again, or None (and the request is counted)."""
        if key.tpm:
            spent = self._tokens.setdefault(key.id, deque())
            while spent and spent[0][0] <= now - 60:
                spent.popleft()
            if sum(n for _, n in spent) >= key.tpm:
                return spent[0][0] + 60 - now
        if key.rpm:
            seen = self._requests.setdefault(key.id, deque())
            while seen and seen[0] <= now - 60:
                seen.popleft()
            if len(seen) >= key.rpm:
                return seen[0] + 60 - now
            seen.append(now)
        return None

    def spend(self, key: Key, tokens: int, now: float) -> None:
        if key.tpm and tokens:
            self._tokens.setdefault(key.id, deque()).append((now, tokens))


class _Reject(Exception):
    """An answer the gateway gives itself (401, 404, 429, 503, …) in OpenAI's error shape."""

    def __init__(self, status: int, message: str, kind: str, code: str | None = None,
                 retry_after: float | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.retry_after = status, message, kind, code, retry_after


class _ClientGone(Exception):
    pass


class _Again(Exception):
    """The engine failed before anything reached the client: the request may go elsewhere (or wait)."""


@dataclass(eq=False)
class _Exchange:
    """One request's bookkeeping, for the log and the metrics."""

    row: Row
    start: float
    key: Key = _ANONYMOUS
    replica: Replica | None = None
    started: bool = False  # the response's first byte went out: no retry after this
    finished: bool = False
    cap_header: str | None = None
    chat: bool = False
    task: asyncio.Task[Any] | None = None
    drained: bool = False  # cancelled by a drain whose grace ran out
    redo: bool = False  # taken off a drained replica before its answer began: sent again elsewhere
    sent: float = 0.0  # monotonic: when it went to its current replica
    hold_until: float | None = None  # monotonic deadline of its waiting, all waits together
    sending: float = 0.0  # monotonic: when the send under way began (0: none); see _stalls
    stalled: bool = False  # cancelled by _stalls: the client took nothing for client_timeout


def error_body(message: str, kind: str, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


class Gateway:
    """The ASGI app. ``keys`` None: no authentication (``--no-auth``). ``open_without_keys``: while
    no key is active, requests without one are let in (on loopback: the machine's own users, who
    can reach the engine's port anyway); the first ``key create`` closes it."""

    def __init__(self, config: GatewayConfig, router: Router, keys: KeyStore | None, log_: RequestLog,
                 metrics: Metrics | None = None, open_without_keys: bool = False) -> None:  # fmt: skip
        self.config = config
        self.open_without_keys = open_without_keys
        self.router = router
        self.keys = keys
        self.log = log_
        self.metrics = metrics or Metrics()
        self.limiter = Limiter()
        self.client: aiohttp.ClientSession | None = None
        self._maintainer: asyncio.Task[None] | None = None
        self._stall_watch: asyncio.Task[None] | None = None
        self.hold = HoldQueue()
        self.in_flight: set[_Exchange] = set()
        # The admin endpoint (drain, release, state): only on the loopback socket of this port,
        # only with this token (server.py writes both where the CLI of this state dir finds them).
        self.admin_port: int | None = None
        self.admin_token: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def startup(self) -> None:
        c = self.config
        self.client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=None, connect=c.connect_timeout, sock_read=c.read_timeout),
            trust_env=False,
            skip_auto_headers=("User-Agent",),
        )
        self.router.refresh()
        self.log.start()
        self._maintainer = asyncio.ensure_future(self._maintain())
        self._stall_watch = asyncio.ensure_future(self._stalls())

    async def shutdown(self) -> None:
        for task in (self._maintainer, self._stall_watch):
            if task:
                task.cancel()
        if self.client:
            await self.client.close()
        self.log.close()

    async def _maintain(self) -> None:
        """Re-read the state store and probe the replicas taken out, every health_interval, and
        every 0.2 s while requests wait for a replica (a request starting to wait wakes it)."""
        while True:
            interval = 0.2 if self.hold.held() else self.config.health_interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self.hold.changed.wait()
            self.hold.changed.clear()
            try:
                await self.refresh()
                await asyncio.gather(*(self._probe(r) for r in self.router.unhealthy()))
                self._release()
                for model, state in self.router.routes.items():
                    for r in state.replicas:
                        self.metrics.replica_up.labels(model, r.name).set(1 if r.healthy and not r.draining else 0)
            except Exception:  # the loop must outlive any one bad round
                log.exception("gateway maintenance round failed")

    async def _stalls(self) -> None:
        """Drop a streaming client that has taken no bytes for client_timeout seconds (the socket's
        buffers full), and with it the engine's request. One watcher for all requests: a timeout
        around each chunk's send cost more CPU than the rest of the chunk's way (a timer set and
        cancelled per chunk), and at 64 streams the gateway's one core is the limit."""
        limit = self.config.client_timeout
        while True:
            await asyncio.sleep(max(0.05, min(1.0, limit / 4)))  # 0 s: any send that blocks
            now = time.monotonic()
            for ex in list(self.in_flight):
                if ex.sending and now - ex.sending >= limit and ex.task is not None and not ex.stalled:
                    ex.stalled = True
                    ex.row.error = f"the client read nothing for {limit:g} s"
                    ex.task.cancel()

    async def refresh(self) -> None:
        deployments = await asyncio.to_thread(read_deployments, self.router.state_db)
        self.router.refresh(deployments)
        self._release()

    def _release(self) -> None:
        """Let the requests waiting for a model go once it has a ready replica; end the waiting of
        those whose model left the gateway."""
        for model in list(self.hold.waiting):
            state = self.router.routes.get(model)
            if state is None:
                n = self.hold.drop(model)
                log.warning("model %s left the gateway: %d waiting request(s) get 503", model, n)
            elif state.ready():
                n = self.hold.release(model)
                if n:
                    log.info("model %s has a ready replica again: %d held request(s) released", model, n)

    async def _probe(self, replica: Replica) -> None:
        assert self.client is not None
        try:
            async with self.client.get(replica.base + "/v1/models", timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                status = resp.status
        except _UPSTREAM_ERRORS:
            return
        if status == 200:
            replica.healthy = True
            replica.last_error = None

    # -- ASGI --------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await self.startup()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.shutdown()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        kind = _PATHS.get(path)
        if path.startswith("/admin/") and self._on_admin_socket(scope):
            await self._admin(scope, receive, send)
        elif kind and method == "POST":
            await self._proxy(scope, receive, send, kind)
        elif path == "/health" and method == "GET":
            await _respond(send, 200, b'{"status":"ok"}', _JSON)
        elif path == "/v1/models" and method == "GET":
            await self._simple(scope, send, self._models)
        elif path == "/metrics" and method == "GET":
            await self._simple(scope, send, self._metrics)
        elif kind or path in ("/health", "/v1/models", "/metrics"):
            await _respond(send, 405, error_body(f"{method} is not allowed on {path}", "invalid_request_error"), _JSON)
        else:
            await _respond(send, 404, error_body(f"no such path: {path}", "invalid_request_error", "not_found"),
                           _JSON)  # fmt: skip

    async def _simple(self, scope: Scope, send: Send, answer: Callable[[Key], tuple[bytes, list[Any]]]) -> None:
        try:
            key = self._authenticate(scope)
        except _Reject as r:
            await _respond(send, r.status, error_body(r.message, r.kind, r.code), _JSON)
            return
        body, headers = answer(key)
        await _respond(send, 200, body, headers)

    # -- the admin endpoint: drain, release, state ---------------------------------------------

    def _on_admin_socket(self, scope: Scope) -> bool:
        server = scope.get("server") or ("", None)
        return self.admin_port is not None and server[1] == self.admin_port and server[0] in ("127.0.0.1", "::1")

    async def _admin(self, scope: Scope, receive: Receive, send: Send) -> None:
        presented = b""
        for name, value in scope["headers"]:
            if name == b"authorization" and value.startswith(b"Bearer "):
                presented = value[7:].strip()
        token = (self.admin_token or "").encode()
        if not token or not hmac.compare_digest(presented, token):
            await _respond(send, 401, error_body("admin: wrong or missing token", "authentication_error"), _JSON)
            return
        path, method = scope["path"], scope["method"]
        try:
            args = json.loads(await self._body(scope, receive) or b"{}") if method == "POST" else {}
            if path == "/admin/drain" and method == "POST":
                answer = await self.drain(str(args["deployment"]), float(args.get("grace", self.config.drain_grace)),
                                          bool(args.get("hold", False)))  # fmt: skip
            elif path == "/admin/release" and method == "POST":
                answer = await self.release(str(args["deployment"]), float(args.get("since", 0.0)))
            elif path == "/admin/state" and method == "GET":
                answer = self.state()
            else:
                await _respond(send, 404, error_body(f"no such admin path: {path}", "invalid_request_error"), _JSON)
                return
        except (ValueError, KeyError, TypeError) as exc:
            await _respond(send, 400, error_body(f"admin: bad request ({exc})", "invalid_request_error"), _JSON)
            return
        await _respond(send, 200, json.dumps(answer).encode(), _JSON)

    async def drain(self, name: str, grace: float, hold: bool) -> dict[str, Any]:
        """Send deployment name no new request; wait for its in-flight ones up to grace seconds,
        then cancel the rest (the client gets an error event, or a 503, and the engine's request
        is closed). ``hold``: its models' routes stay while it is replaced, requests waiting."""
        start = time.monotonic()
        await self.refresh()
        max_hold = max([self.config.hold_wait, *(r.hold_wait or 0 for r in self.config.routes)])
        replicas = self.router.drain(name, max_hold if hold else None)
        ids = {id(r) for r in replicas}
        in_flight = [ex for ex in self.in_flight if ex.replica is not None and id(ex.replica) in ids]
        deadline = start + grace

        def there(ex: _Exchange) -> bool:  # still being answered by a drained replica
            return not ex.finished and not ex.redo and ex.replica is not None and id(ex.replica) in ids

        moved = cancelled = 0
        while any(there(ex) for ex in in_flight) and time.monotonic() < deadline:
            # Queued in the engine, no token yet, and another replica is ready: sent there now
            # rather than after a queue's wait on an engine that is going away.
            for ex in in_flight:
                if there(ex) and not ex.started and ex.row.ttft is None and ex.task and self._elsewhere(ex):
                    # Its wait on this engine until now is the engine's queue, not the drain's.
                    ex.sent = max(ex.sent, start)
                    ex.redo = True
                    ex.task.cancel()
                    moved += 1
            await asyncio.sleep(0.02)
        for ex in in_flight:
            if there(ex) and ex.task is not None:
                if ex.started:
                    ex.drained = True
                    cancelled += 1
                else:
                    ex.redo = True
                    moved += 1
                ex.task.cancel()
        if cancelled:
            await asyncio.sleep(0)  # let the cancelled requests answer before ranks are stopped
        models = sorted(self.router.models_of.get(name, ()))
        log.info("drained %s: %d request(s) finished, %d moved, %d cancelled after %.1f s", name,
                 len(in_flight) - cancelled - moved, moved, cancelled, time.monotonic() - start)  # fmt: skip
        return {"deployment": name, "replicas": len(replicas), "finished": len(in_flight) - cancelled - moved,
                "cancelled": cancelled, "moved": moved, "seconds": round(time.monotonic() - start, 3), "models": models,
                "held": hold, "since": time.time() - (time.monotonic() - start)}  # fmt: skip

    async def release(self, name: str, since: float) -> dict[str, Any]:
        """The change of deployment name is over: routes from the state store now, the held
        requests released where a replica is ready; what was held since ``since``."""
        models = self.router.undrain(name)
        await self.refresh()
        models |= {m for m, st in self.router.routes.items() if any(r.name == name for r in st.replicas)}
        return {"deployment": name, "models": sorted(models), **self.hold.summary(since, models)}

    def state(self) -> dict[str, Any]:
        return {"routes": {m: {"waiting": self.hold.held(m), "replicas": [
            {"name": r.name, "instance": r.instance, "outstanding": r.outstanding, "healthy": r.healthy,
             "draining": r.draining} for r in st.replicas]} for m, st in self.router.routes.items()}}  # fmt: skip

    async def _cancelled_by_drain(self, ex: _Exchange, send: Send) -> None:
        ex.row.status, ex.row.error = 503, "cancelled: its deployment was drained and the grace ran out"
        with contextlib.suppress(Exception):  # the client may be gone too
            if ex.started:
                event = b"data: " + error_body("the deployment was drained; the answer was cut", "server_error")
                await send({"type": "http.response.body", "body": event + b"\n\n", "more_body": False})
            else:
                await _respond(send, 503, error_body("the deployment was drained before the answer began; retry",
                               "server_error", "unavailable"), [*_JSON, (b"retry-after",
                               str(self.config.retry_after).encode())], ex)  # fmt: skip

    def _models(self, key: Key) -> tuple[bytes, list[Any]]:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "sparkfleet"}
                for m in self.router.models() if key.allows(m)]  # fmt: skip
        return json.dumps({"object": "list", "data": data}).encode(), _JSON

    def _metrics(self, key: Key) -> tuple[bytes, list[Any]]:
        return self.metrics.scrape(), [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]

    def _authenticate(self, scope: Scope) -> Key:
        if self.keys is None:
            return _ANONYMOUS
        presented = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer" and token.strip():
                    presented = token.strip()
        key = self.keys.verify(presented) if presented else None
        if key is not None:
            return key
        if self.open_without_keys and not self.keys.any_active():
            return _ANONYMOUS
        if presented is None:
            raise _Reject(401, "no API key given: send it as 'Authorization: Bearer KEY'", "authentication_error",
                          "invalid_api_key")  # fmt: skip
        # Never echo the value: a key pasted into the wrong place is still a key.
        raise _Reject(401, "invalid, expired or revoked API key", "authentication_error", "invalid_api_key")

    # -- the proxied requests ----------------------------------------------------------------

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, kind: str) -> None:
        ex = _Exchange(Row(time=time.time(), request_id=os.urandom(8).hex(), key_name=None, model=None,
                           deployment=None, status=0), time.monotonic(), chat=kind == "chat")  # fmt: skip
        task = asyncio.current_task()
        ex.task = task
        self.in_flight.add(ex)
        watcher: asyncio.Future[None] | None = None
        try:
            try:
                ex.key = self._authenticate(scope)
                ex.row.key_name = ex.key.name
                raw = await self._body(scope, receive)
                # From here on the body is read: a disconnect is the client going away.
                watcher = asyncio.ensure_future(_until_disconnect(receive))
                watcher.add_done_callback(lambda f: task.cancel() if task and not ex.finished and not f.cancelled()
                                          else None)  # fmt: skip
                await self._answer(ex, raw, kind, send)
            except _Reject as r:
                headers = list(_JSON)
                if r.retry_after is not None:
                    headers.append((b"retry-after", str(max(1, round(r.retry_after))).encode()))
                ex.row.status, ex.row.error = r.status, r.message
                if not ex.started:
                    await _respond(send, r.status, error_body(r.message, r.kind, r.code), headers, ex)
        except (asyncio.CancelledError, _ClientGone):
            if task is not None:
                task.uncancel()
            if ex.drained:
                await self._cancelled_by_drain(ex, send)
            else:
                ex.row.status = ex.row.status if ex.row.status and ex.row.status != 200 else 499
                ex.row.error = ex.row.error or "client went away"
        finally:
            self.in_flight.discard(ex)
            ex.finished = True
            if watcher is not None:
                watcher.cancel()
            self._record(ex)

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.config.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise _Reject(413, f"request body over {limit} bytes", "invalid_request_error", "body_too_large")
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _Reject(413, f"request body over {limit} bytes", "invalid_request_error", "body_too_large")
            parts.append(chunk)
            if not message.get("more_body"):
                return b"".join(parts)

    def _route(self, ex: _Exchange, raw: bytes) -> tuple[dict[str, Any], Route]:
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise _Reject(400, f"the request body is not valid JSON ({exc})", "invalid_request_error") from None
        if not isinstance(body, dict):
            raise _Reject(400, "the request body must be a JSON object", "invalid_request_error")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _Reject(400, "the request names no model ('model' is required)", "invalid_request_error")
        ex.row.model = model
        state = self.router.routes.get(model)
        if state is None or not ex.key.allows(model):
            available = [m for m in self.router.models() if ex.key.allows(m)]
            raise _Reject(404, f"the model {model!r} does not exist or this key may not use it; available: "
                          f"{', '.join(available) or 'none'}", "invalid_request_error", "model_not_found")  # fmt: skip
        return body, state.route

    async def _answer(self, ex: _Exchange, raw: bytes, kind: str, send: Send) -> None:
        body, route = self._route(ex, raw)
        now = time.monotonic()
        wait = self.limiter.check(ex.key, now)
        if wait is not None:
            raise _Reject(429, f"rate limit of key {ex.key.name!r} reached; retry in {max(1, round(wait))} s",
                          "rate_limit_error", "rate_limit_exceeded", retry_after=wait)  # fmt: skip
        for name, value in route.fields:
            if name not in body:
                body[name] = value
            elif isinstance(value, dict) and isinstance(body[name], dict):
                body[name] = {**value, **body[name]}  # the client's keys win, the route's others stay
        if kind != "embeddings":
            ex.cap_header = _cap(body, kind, route.max_new_tokens)
            if ex.cap_header:
                ex.row.clamped = 1
                self.metrics.clamped.labels(route.model).inc()
        if self.config.log_bodies:
            ex.row.request_body = json.dumps(body)
        client_stream = bool(body.get("stream"))
        up_stream = kind != "embeddings" and (client_stream or route.loop.enabled)
        want_usage = client_stream and bool((body.get("stream_options") or {}).get("include_usage"))
        if up_stream:
            # Usage for the log; dropped again on the way out when the client did not ask for it.
            body["stream"] = True
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        self.metrics.in_flight.labels(route.model).inc()
        try:
            while True:
                try:
                    replica, resp, first = await self._open(ex, body, "/v1/" + _upstream_path(kind), route)
                except asyncio.CancelledError:
                    if self._redo(ex):
                        continue
                    raise
                try:
                    if resp.status != 200 or not up_stream:
                        await self._whole(ex, resp, first, send)
                    elif client_stream:
                        await self._stream(ex, route, resp, first, want_usage, send)
                    else:
                        await self._assemble(ex, route, resp, first, send)
                    return
                except _Again:
                    continue  # nothing reached the client: another replica, or wait for one
                except asyncio.CancelledError:
                    if self._redo(ex):
                        continue
                    raise
                finally:
                    # Not read to the end (a loop abort, a client gone): closing the connection is
                    # what tells the engine to stop.
                    if resp.content.at_eof():
                        resp.release()
                    else:
                        resp.close()
                    replica.outstanding -= 1
        finally:
            self.metrics.in_flight.labels(route.model).dec()

    async def _open(self, ex: _Exchange, body: dict[str, Any], path: str, route: Route
                    ) -> tuple[Replica, aiohttp.ClientResponse, bytes]:  # fmt: skip
        """Send the request to the least busy ready replica, then to the next one while a replica
        fails before its first byte (connection refused or reset, 5xx); with none ready, wait for
        one (hold.py) within the route's limits."""
        assert self.client is not None
        model = body["model"]
        tried: set[int] = set()
        last_error = "no replica is ready"
        while True:
            replica = self.router.pick(model, tried)
            if replica is None:
                last_error = await self._wait_for_replica(ex, model, route, last_error)
                tried.clear()
                continue
            tried.add(id(replica))
            ex.replica = replica
            ex.row.deployment = replica.name
            body["model"] = replica.upstream_model
            payload = json.dumps(body).encode()
            replica.outstanding += 1
            ex.sent = time.monotonic()
            resp: aiohttp.ClientResponse | None = None
            try:
                resp = await self.client.post(replica.base + path, data=payload,
                                              headers={"content-type": "application/json"})  # fmt: skip
                if resp.status >= 500:
                    detail = (await resp.read())[:200].decode("utf-8", "replace")
                    raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status, message=detail)
                first = await resp.content.readany()
                body["model"] = model
                return replica, resp, first
            except _UPSTREAM_ERRORS as exc:
                replica.outstanding -= 1
                if resp is not None:
                    resp.close()
                last_error = f"{replica.name}: {type(exc).__name__} {str(exc)[:200]}".strip()
                self.router.failed(replica, last_error)
                log.warning("replica %s failed, taken out: %s", replica.name, last_error)
            except BaseException:
                replica.outstanding -= 1
                if resp is not None:
                    resp.close()
                raise
            finally:
                body["model"] = model

    def _elsewhere(self, ex: _Exchange) -> bool:
        state = self.router.routes.get(ex.row.model or "")
        return bool(state and state.ready())

    def _redo(self, ex: _Exchange) -> bool:
        """A drain took this request off its replica before anything reached the client: it goes
        to another replica (or waits for one) instead of failing."""
        if not ex.redo or ex.started:
            return False
        ex.redo = False
        if ex.task is not None:
            ex.task.uncancel()
        # The time it sat on the drained replica is wait the change added, as a hold's is.
        ex.row.held = (ex.row.held or 0.0) + time.monotonic() - ex.sent
        return True

    async def _wait_for_replica(self, ex: _Exchange, model: str, route: Route, why: str) -> str:
        """Wait until model has a ready replica (503 with Retry-After past the route's limits)."""
        queue, wait = self.config.hold_limits(route)
        ex.replica = None  # waiting, it is in flight on no replica (a drain must not cancel it)
        if ex.hold_until is None:
            ex.hold_until = time.monotonic() + wait
        left = ex.hold_until - time.monotonic()
        retry = self.config.retry_after
        if model not in self.router.routes:
            raise _Reject(503, f"model {model!r} was taken off the gateway ({why}); retry later", "server_error",
                          "unavailable", retry_after=retry)  # fmt: skip
        if left <= 0:
            said = f"no replica was ready within {wait:g} s (hold_wait)" if wait else why
            raise _Reject(503, f"model {model!r} is not available now ({said}); retry later", "server_error",
                          "unavailable", retry_after=retry)  # fmt: skip
        self.metrics.held.labels(model).inc()
        try:
            waited = await self.hold.wait(model, queue, left)
        except QueueFull:
            self.metrics.hold_outcomes.labels(model, "full").inc()
            raise _Reject(
                503,
                f"model {model!r} has no ready replica and {queue} request(s) wait for it already "
                "(hold_queue); retry later",
                "server_error",
                "unavailable",
                retry_after=retry,
            ) from None
        except TimeoutError:
            self.metrics.hold_outcomes.labels(model, "timeout").inc()
            ex.row.held = (ex.row.held or 0.0) + max(0.0, left)
            raise _Reject(
                503,
                f"model {model!r} is not available now (no replica was ready within {wait:g} s, "
                "hold_wait); retry later",
                "server_error",
                "unavailable",
                retry_after=retry,
            ) from None
        except RouteGone:
            self.metrics.hold_outcomes.labels(model, "dropped").inc()
            raise _Reject(
                503,
                f"model {model!r} was taken off the gateway while the request waited; retry later",
                "server_error",
                "unavailable",
                retry_after=retry,
            ) from None
        finally:
            self.metrics.held.labels(model).dec()
        self.metrics.hold_outcomes.labels(model, "released").inc()
        ex.row.held = (ex.row.held or 0.0) + waited
        return "no replica is ready"

    async def _whole(self, ex: _Exchange, resp: aiohttp.ClientResponse, first: bytes, send: Send) -> None:
        """A non-streamed answer (or an engine's error) passed through as it is."""
        data = first + await resp.content.read()
        ex.row.status = resp.status
        self._first_byte(ex)
        if resp.status == 200:
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                obj = json.loads(data)
                self._usage(ex, obj.get("usage"))
                ex.row.finish_reason = (obj.get("choices") or [{}])[0].get("finish_reason")
        else:
            ex.row.error = data[:300].decode("utf-8", "replace")
        kind = resp.headers.get("content-type", "application/json").encode("latin-1")
        await _respond(send, resp.status, data, [(b"content-type", kind)], ex)

    async def _stream(self, ex: _Exchange, route: Route, resp: aiohttp.ClientResponse, first: bytes, want_usage: bool,
                      send: Send) -> None:  # fmt: skip
        watch = Watch(
            chat=ex.chat, loop=route.loop, drop_usage=not want_usage, text=[] if self.config.log_bodies else None
        )
        headers = [*_SSE, (b"x-request-id", ex.row.request_id.encode()), *self._headers(ex)]
        started = False
        try:
            async for out in _pump(resp, first, watch):
                if not started:
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    ex.started = started = True
                    self._first_byte(ex)
                if watch.done:  # [DONE] goes out now: a client that reads it and goes is no 499
                    self._finish(ex, route, watch, 200)
                    ex.finished = True
                ex.sending = time.monotonic()  # a send that takes client_timeout: _stalls drops it
                await send({"type": "http.response.body", "body": out, "more_body": True})
                ex.sending = 0.0
        except _UPSTREAM_ERRORS as exc:
            # The engine went away mid-answer: tell the client in the stream (the openai client
            # raises on an error event) and take the replica out until it answers again.
            assert ex.replica is not None
            self.router.failed(ex.replica, f"{type(exc).__name__} mid-answer")
            ex.row.error = f"upstream {type(exc).__name__} mid-answer"
            event = b"data: " + error_body("the engine stopped mid-answer", "server_error") + b"\n\n"
            if not started:
                raise _Again from None
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if not started:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            ex.started = True
            self._first_byte(ex)
        self._finish(ex, route, watch, 200)
        ex.finished = True  # the answer is whole: a client that goes away from here on cancels nothing
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _assemble(self, ex: _Exchange, route: Route, resp: aiohttp.ClientResponse, first: bytes,
                        send: Send) -> None:  # fmt: skip
        """A non-streamed request, asked upstream as a stream so the loop detector can read it."""
        watch = Watch(chat=ex.chat, loop=route.loop, drop_usage=True, text=[] if self.config.log_bodies else None)
        assembler = Assembler(ex.chat)
        try:
            async for out in _pump(resp, first, watch):
                if ex.row.ttft is None:
                    ex.row.ttft = time.monotonic() - ex.start
                assembler.feed(out)
        except _UPSTREAM_ERRORS as exc:
            assert ex.replica is not None
            self.router.failed(ex.replica, f"{type(exc).__name__} mid-answer")
            raise _Again from None  # assembled here: nothing reached the client yet
        answer = assembler.result(watch.final_usage(), None, None)
        self._finish(ex, route, watch, 200)
        await _respond(send, 200, json.dumps(answer).encode(), _JSON + self._headers(ex), ex)

    def _headers(self, ex: _Exchange) -> list[tuple[bytes, bytes]]:
        return [(b"x-sparkfleet-output-cap", ex.cap_header.encode())] if ex.cap_header else []

    def _first_byte(self, ex: _Exchange) -> None:
        if ex.row.ttft is None:
            ex.row.ttft = time.monotonic() - ex.start

    def _usage(self, ex: _Exchange, usage: dict[str, Any] | None) -> None:
        if usage:
            ex.row.prompt_tokens = usage.get("prompt_tokens")
            ex.row.completion_tokens = usage.get("completion_tokens")

    def _finish(self, ex: _Exchange, route: Route, watch: Watch, status: int) -> None:
        ex.row.status = status
        self._usage(ex, watch.final_usage())
        ex.row.finish_reason = watch.finish_reason
        if watch.aborted:
            ex.row.loop_aborted = 1
            ex.row.error = f"loop aborted: {watch.aborted}"
            self.metrics.loop_aborts.labels(route.model).inc()
            log.warning("request %s: answer stopped, %s", ex.row.request_id, watch.aborted)
        if watch.text is not None:
            ex.row.response_text = "".join(watch.text)

    def _record(self, ex: _Exchange) -> None:
        row = ex.row
        row.e2e = time.monotonic() - ex.start
        model = row.model if row.model in self.router.routes else "-"  # no label per made-up model name
        self.metrics.requests.labels(model, str(row.status), row.key_name or "-").inc()
        if row.ttft is not None and row.status == 200:
            self.metrics.ttft.labels(model).observe(row.ttft)
            self.metrics.e2e.labels(model).observe(row.e2e)
        tokens = (row.prompt_tokens or 0) + (row.completion_tokens or 0)
        if row.prompt_tokens:
            self.metrics.tokens.labels(model, "prompt").inc(row.prompt_tokens)
        if row.completion_tokens:
            self.metrics.tokens.labels(model, "completion").inc(row.completion_tokens)
        self.limiter.spend(ex.key, tokens, time.monotonic())
        self.log.add(row)


def _upstream_path(kind: str) -> str:
    return {"chat": "chat/completions", "completions": "completions", "embeddings": "embeddings"}[kind]


def _cap(body: dict[str, Any], kind: str, cap: int) -> str | None:
    """Fill or clamp the request's output limit; what was done, for the response header."""
    if not cap:
        return None
    fields = _CAP_FIELDS[kind]
    given = [f for f in fields if body.get(f) is not None]
    if not given:
        body["max_tokens"] = cap
        return f"filled max_tokens={cap}"
    notes = []
    for f in given:
        value = body[f]
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            body[f] = cap
            notes.append(f"clamped {f}={value}->{cap}")
    return "; ".join(notes) or None


async def _pump(resp: aiohttp.ClientResponse, first: bytes, watch: Watch) -> AsyncIterator[bytes]:
    """The bytes to forward: whole events, read by the watch; stops after a loop abort (the
    caller then closes the response, and with it the engine's connection)."""
    buf = first
    content = resp.content
    while True:
        cut = last_event_end(buf)
        if cut:
            chunk, buf = (buf, b"") if cut == len(buf) else (buf[:cut], buf[cut:])
            out = watch.feed(chunk)
            if out:
                yield out
            if watch.aborted:
                return
        data = await content.readany()
        if not data:
            break
        buf = buf + data if buf else data
    if buf:
        yield watch.feed(buf + b"\n\n")


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _respond(send: Send, status: int, body: bytes, headers: list[Any], ex: _Exchange | None = None) -> None:
    if ex is not None:
        ex.started = True
        if not ex.row.status:
            ex.row.status = status
        headers = [*headers, (b"x-request-id", ex.row.request_id.encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})  # fmt: skip
    if ex is not None:
        ex.finished = True  # the whole answer is in this send: a client that reads it and goes is no 499
    await send({"type": "http.response.body", "body": body})
