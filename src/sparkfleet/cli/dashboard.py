"""``sparkfleet dashboard [--host 127.0.0.1] [--port 8765] [--token TOKEN]``: the web dashboard."""

from __future__ import annotations

import ipaddress
import secrets
import socket
from typing import Annotated

import typer

from sparkfleet.cli.console import console
from sparkfleet.errors import UsageError

TOKEN_ENV = "SPARKFLEET_DASHBOARD_TOKEN"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether host only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a SparkfleetError that says why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host!r}: cannot resolve it ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror} (try another --port)") from None
    sock.listen(128)
    return sock


def dashboard(
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (a token is required on every address).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free port).")] = 8765,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar=TOKEN_ENV,
            show_envvar=True,
            help="Access token (generated and printed when none is given).",
        ),
    ] = None,
) -> None:
    """Serve the dashboard: deployments (live), bench history, quality and needle runs, doctor.
    It reads the state store; it stops or restarts a deployment only when asked to on the page."""
    # Starlette, uvicorn and the library behind the pages load only for this command (CLI start-up).
    try:
        import uvicorn

        from sparkfleet.dashboard.app import create_app
    except ImportError as exc:
        raise UsageError(
            f"the dashboard needs its extras ({exc.name} is missing): pip install 'sparkfleet[dashboard]'"
        ) from None
    from sparkfleet.state.store import Store

    loopback = is_loopback(host)
    # Loopback too: every local user can reach 127.0.0.1, and the page stops deployments.
    token = token or secrets.token_urlsafe(24)
    sock = bind(host, port)
    bound_port = sock.getsockname()[1]
    # The token guards; on loopback the Host check also stops DNS rebinding.
    allowed = list(LOOPBACK_NAMES) if loopback else None
    store = Store()
    app = create_app(store, token=token, allowed_hosts=allowed)
    shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    url = f"http://{shown}:{bound_port}/?token={token}"
    console.print(f"dashboard on [bold]{url}[/] (state {store.path}); Ctrl-C stops it", soft_wrap=True)
    # No access log: the first request of a browser carries the token in its address.
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


COMMANDS = {"dashboard": dashboard}
