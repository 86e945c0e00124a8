"""One health check (apply/observe.get_health) for readiness, ``status`` and ``watch``: the
server's own message on a failing answer, and an unreachable server named by its cause."""

from __future__ import annotations

import socket
import threading
import urllib.error
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from sparkfleet.apply.observe import get_health, unreachable
from sparkfleet.plan.engines.base import Readiness

HEALTH = Readiness(serves_http=True, health_path="/health", ready_log=None)


class _Loading(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}'
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


def test_a_failing_answer_carries_the_servers_message() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Loading)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert get_health(f"http://127.0.0.1:{server.server_port}", HEALTH) == (False, "HTTP 503 Loading model")
    finally:
        server.shutdown()


def test_a_closed_port_is_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert get_health(f"http://127.0.0.1:{port}", HEALTH) == (False, "connection refused")


def test_no_health_path_is_healthy_without_asking() -> None:
    assert get_health("http://127.0.0.1:9", Readiness(serves_http=False, health_path=None, ready_log=None)) == (
        True, "-")  # fmt: skip


@pytest.mark.parametrize(
    ("exc", "why"),
    [(urllib.error.URLError(socket.gaierror(-2, "Name or service not known")), "DNS: name not resolved"),
     (TimeoutError("timed out"), "timed out"), (urllib.error.URLError(TimeoutError()), "timed out"),
     (ConnectionResetError(), "connection reset")],
)  # fmt: skip
def test_an_unreachable_server_is_named_by_its_cause(exc: BaseException, why: str) -> None:
    assert unreachable(exc) == why
