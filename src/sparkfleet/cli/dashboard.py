"""``sparkfleet dashboard [--host 127.0.0.1] [--port 8765] [--token TOKEN]``: the web dashboard."""

from __future__ import annotations

import ipaddress
import secrets
import socket
from pathlib import Path
from typing import Annotated

import typer

from sparkfleet.cli.console import console
from sparkfleet.errors import UsageError

TOKEN_ENV = "SPARKFLEET_DASHBOARD_TOKEN"


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
        from sparkfleet.dashboard.app import serve
    except ImportError as exc:
        raise UsageError(
            f"the dashboard needs its extras ({exc.name} is missing): pip install 'sparkfleet[dashboard]'"
        ) from None

    def announce(url: str, state: Path) -> None:
        console.print(f"dashboard on [bold]{url}[/] (state {state}); Ctrl-C stops it", soft_wrap=True)

    # A token on loopback too: every local user can reach 127.0.0.1, and the page stops deployments.
    serve(bind(host, port), host, token or secrets.token_urlsafe(24), is_loopback(host), announce)


COMMANDS = {"dashboard": dashboard}
