"""The dashboard's ASGI app: one HTML page, its static files and a JSON API over the state store.

Guards, in order: the Host header must name this server (no DNS rebinding onto localhost); the
token (the CLI always sets one: any local user can connect to a loopback port) must come with every
request (``?token=`` once, which sets a same-site cookie, or an
``Authorization: Bearer`` header); actions are POSTs with a custom header, which a cross-site form
cannot send, so another web page cannot stop a deployment through the user's browser.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from sparkfleet.dashboard import data, gateway_data, watch_data
from sparkfleet.errors import SparkfleetError
from sparkfleet.state.store import Store

STATIC = Path(__file__).resolve().parent / "static"
COOKIE = "sparkfleet_token"
ACTION_HEADER = "x-sparkfleet-action"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class _TokenGate(BaseHTTPMiddleware):
    """Refuse every request that does not carry the access token."""

    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self.token = token

    def _ok(self, value: str | None) -> bool:
        return value is not None and secrets.compare_digest(value.encode(), self.token.encode())

    async def dispatch(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        given = request.query_params.get("token")
        if given is not None:
            if not self._ok(given):
                return PlainTextResponse("wrong access token", status_code=401)
            # Trade the token in the address for a cookie, so it leaves the address bar and history.
            response = RedirectResponse(request.url.remove_query_params("token"), status_code=303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
            return response
        auth = request.headers.get("authorization", "")
        bearer = auth[7:] if auth.lower().startswith("bearer ") else None
        if self._ok(bearer) or self._ok(request.cookies.get(COOKIE)):
            return await call_next(request)
        return PlainTextResponse(
            "access token required: open the address `sparkfleet dashboard` printed (it ends in ?token=…)",
            status_code=401,
        )


def create_app(store: Store, *, token: str | None = None, allowed_hosts: list[str] | None = None) -> Starlette:
    """The app over store; token None means no token (for tests in one process: the CLI always
    sets one, loopback included, since every local user can reach a loopback port)."""

    def json_of(fn: Callable[..., Any], *args: Any) -> Callable[[], Awaitable[Response]]:
        async def call() -> Response:
            try:
                # The store and the nodes are read with blocking calls: keep them off the event loop.
                return JSONResponse(await run_in_threadpool(fn, store, *args))
            except data.NotFound as exc:
                return JSONResponse({"error": str(exc)}, status_code=404)
            except SparkfleetError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)

        return call

    async def index(_: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def no_icon(_: Request) -> Response:
        return Response(status_code=204)

    async def deployments(_: Request) -> Response:
        return await json_of(data.deployments)()

    async def action(request: Request) -> Response:
        if request.headers.get(ACTION_HEADER) != "1":
            return JSONResponse({"error": f"actions need the {ACTION_HEADER} header"}, status_code=403)
        name, verb = request.path_params["name"], request.path_params["verb"]
        if verb == "down":
            return await json_of(lambda s, n: {"stopped": data.down_deployment(s, n)}, name)()
        if verb == "restart":
            return await json_of(lambda s, n: {"endpoint": data.restart_deployment(s, n)}, name)()
        return JSONResponse({"error": f"unknown action {verb!r}"}, status_code=404)

    async def bench_runs(_: Request) -> Response:
        return await json_of(data.bench_runs)()

    async def bench_run(request: Request) -> Response:
        return await json_of(data.bench_run, request.path_params["run_id"])()

    async def eval_runs(request: Request) -> Response:
        return await json_of(data.eval_runs, request.query_params.get("kind"))()

    async def quality_run(request: Request) -> Response:
        return await json_of(data.quality_run, request.path_params["run_id"])()

    async def quality_compare(request: Request) -> Response:
        a, b = request.query_params.get("a"), request.query_params.get("b")
        if not a or not b:
            return JSONResponse({"error": "compare needs ?a=RUN&b=RUN"}, status_code=400)
        return await json_of(data.quality_compare, a, b)()

    async def needle_run(request: Request) -> Response:
        return await json_of(data.needle_run, request.path_params["run_id"])()

    async def doctor(_: Request) -> Response:
        return await json_of(data.doctor)()

    async def fabric(_: Request) -> Response:
        return await json_of(data.fabric)()

    async def experiments(_: Request) -> Response:
        return await json_of(data.experiments)()

    async def experiment(request: Request) -> Response:
        return await json_of(data.experiment, request.path_params["experiment_id"])()

    async def gateway(_: Request) -> Response:
        return await json_of(gateway_data.gateway)()

    async def watched(_: Request) -> Response:
        return await json_of(watch_data.watched)()

    async def watch_series(request: Request) -> Response:
        return await json_of(watch_data.watch_series, request.path_params["name"])()

    routes = [
        Route("/", index),
        Route("/favicon.ico", no_icon),
        Route("/api/deployments", deployments),
        Route("/api/deployments/{name}/{verb}", action, methods=["POST"]),
        Route("/api/bench/runs", bench_runs),
        Route("/api/bench/runs/{run_id:int}", bench_run),
        Route("/api/evals/runs", eval_runs),
        Route("/api/evals/quality/compare", quality_compare),
        Route("/api/evals/quality/{run_id}", quality_run),
        Route("/api/evals/needle/{run_id}", needle_run),
        Route("/api/doctor", doctor),
        Route("/api/doctor/fabric", fabric),
        Route("/api/gateway", gateway),
        Route("/api/watch", watched),
        Route("/api/watch/{name}", watch_series),
        Route("/api/experiments", experiments),
        Route("/api/experiments/{experiment_id:int}", experiment),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or ["*"])]
    if token is not None:
        middleware.append(Middleware(_TokenGate, token=token))
    return Starlette(routes=routes, middleware=middleware)


def serve(sock: socket.socket, host: str, token: str, loopback: bool, announce: Callable[[str, Path], None]) -> None:
    """Serve the dashboard on sock until interrupted; announce gets its address (which carries
    the token) and the state store's path."""
    store = Store()
    # The token guards; on loopback the Host check also stops DNS rebinding.
    app = create_app(store, token=token, allowed_hosts=list(LOOPBACK_NAMES) if loopback else None)
    shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    announce(f"http://{shown}:{sock.getsockname()[1]}/?token={token}", store.path)
    # No access log: the first request of a browser carries the token in its address.
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")).run(sockets=[sock])
