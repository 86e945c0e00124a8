"""``sparkfleet gateway serve``: build the app from a config and serve it with uvicorn (uvloop and
httptools when installed: the per-chunk cost is mostly the event loop's and the HTTP writer's)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path

from sparkfleet.errors import GatewayError
from sparkfleet.gateway import db
from sparkfleet.gateway.app import Gateway
from sparkfleet.gateway.config import GatewayConfig
from sparkfleet.gateway.keys import KeyStore
from sparkfleet.gateway.observe import Metrics, RequestLog
from sparkfleet.gateway.routing import Router


def build(config: GatewayConfig, state_db: Path, loopback: bool, gateway_db: Path | None = None) -> Gateway:
    """The app, its key store and request log opened, routes not yet read (startup does that).
    ``loopback``: whether the address it listens on takes connections from this machine alone."""
    keys = KeyStore(db.connect(gateway_db)) if config.auth else None
    if keys is not None and not keys.any_active() and not loopback:
        raise GatewayError(
            f"--host {config.host}: off loopback the gateway needs API keys; create one with "
            "`sparkfleet gateway key create NAME` (or pass --no-auth to serve without keys)"
        )
    request_log = RequestLog(db.connect(gateway_db), config.log_keep_days, config.log_keep_rows)
    return Gateway(config, Router(config, state_db), keys, request_log, Metrics(), open_without_keys=loopback)


def serve(config: GatewayConfig, state_db: Path, loopback: bool, bind: Callable[[str, int], socket.socket],
          announce: Callable[[str], None]) -> None:  # fmt: skip
    """Serve until interrupted; ``bind(host, port)`` makes the listening socket (the CLI's, which
    says in one line why it cannot)."""
    import uvicorn

    for what, path in (("tls_cert", config.tls_cert), ("tls_key", config.tls_key)):
        if path and not Path(path).is_file():
            raise GatewayError(f"{what} {path!r}: no such file")
    if bool(config.tls_cert) != bool(config.tls_key):
        raise GatewayError("tls_cert and tls_key go together: give both or neither")
    app = build(config, state_db, loopback)
    sock = bind(config.host, config.port)
    # The admin endpoint (drain, release) listens on loopback alone, on a port of its own, and
    # answers only with the token in the file next to the state store (0600, its owner's).
    admin = bind("127.0.0.1", 0)
    app.admin_port = admin.getsockname()[1]
    app.admin_token = secrets.token_urlsafe(32)
    admin_file = write_admin_file(state_db.parent, app.admin_port, app.admin_token)
    port = sock.getsockname()[1]
    scheme = "https" if config.tls_cert else "http"
    shown = f"[{config.host}]" if ":" in config.host else config.host
    announce(f"{scheme}://{shown}:{port}/v1")
    uv = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,  # the request log is the gateway's own; an access log would only duplicate it
        proxy_headers=False,  # nothing here reads the client's address: trust no X-Forwarded-* header
        lifespan="on",
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        ssl_certfile=config.tls_cert,
        ssl_keyfile=config.tls_key,
        timeout_keep_alive=30,
    )
    try:
        _server_class()(uv).run(sockets=[sock, admin])
    finally:
        admin_file.unlink(missing_ok=True)


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but at a stop an idle TLS connection is cut rather than closed: a TLS
        close waits for the client's close_notify, up to the event loop's 30 s TLS shutdown timeout,
        and a client that keeps its connections pooled (the openai client does) never sends it, so
        every stop took 30 s. A connection in the middle of an answer still gets to finish it."""

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if self.config.is_ssl:
                for conn in list(self.server_state.connections):
                    cycle, transport = getattr(conn, "cycle", None), getattr(conn, "transport", None)
                    if transport is not None and (cycle is None or cycle.response_complete):
                        transport.abort()
            await super().shutdown(sockets)

    return Server


def admin_dir(state: Path) -> Path:
    return state / "gateways"


def write_admin_file(state: Path, port: int, token: str) -> Path:
    """Where the CLI of this state dir finds this gateway's admin endpoint (one file per gateway)."""
    folder = admin_dir(state)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{os.getpid()}.json"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"url": f"http://127.0.0.1:{port}", "token": token, "pid": os.getpid(),
                   "host": socket.gethostname()}, fh)  # fmt: skip
    return path
