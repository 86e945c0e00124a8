"""A stand-in engine rank for lifecycle tests: answers like an OpenAI server at once.

Takes an engine's argv (``--port P``, ``--node-rank R``, anything else ignored). Rank 0 serves
GET /health, GET /v1/models and POST /v1/completions (answer " 42"); other ranks just stay up.
Env knobs for faults: STANDIN_DELAY (seconds before serving), STANDIN_EXIT (exit with this code
after the delay), STANDIN_LOG_LINE (an extra boot-log line), STANDIN_ANSWER, and
STANDIN_FAULT_RANK (apply the delay, line and exit to this rank only), STANDIN_HEAD_DELAY (rank 0
waits this long before serving, whatever the fault rank), STANDIN_LEAK=NAME (print env
NAME's value and a bearer header with it at boot, as careless engines do), STANDIN_ORPHAN
(``keep`` or ``drop``: at boot, start a child in its own session, ``setsid`` as a leaky engine's
helper does, that outlives the rank; ``keep`` leaves it the rank's environment, sparkfleet's
markers included, ``drop`` starts it with an empty one; its pid goes to the log as
``standin: orphan pid N``).

Streaming requests (``"stream": true``, completions or chat) get SSE chunks of one token each,
``--standin-itl SECONDS`` apart (default 0.005), then a usage chunk: a server with a known decode
speed, for the A/B runner's verdicts. ``--standin-itl`` is a flag so a recipe variant changes it
the way it changes an engine's speed knob.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

# Only what every rank needs at the top: on the benchmark's 16-node loopback fleet, 15 worker
# ranks boot on 2 shared cores while sparkfleet starts the head, and http.server and json are
# most of a rank's start-up. Rank 0 imports them when it serves.


def _arg(flag: str, default: str) -> str:
    argv = sys.argv[1:]
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else default


def _model() -> str:
    """The served name, as an engine derives it from its flags (the bench looks it up)."""
    return _arg("--served-model-name", _arg("--model-path", _arg("--model", "standin")))


def _handler() -> Any:
    """The HTTP handler class of rank 0 (its imports happen here, not at start-up)."""
    import json
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": _model(), "object": "model"}]})
            else:
                self._send(404, {"error": "not found"})

        def _stream(self, body: dict, chat: bool) -> None:
            tokens = int(body.get("max_tokens") or 16)
            itl = float(_arg("--standin-itl", "0.005"))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            kind = "chat.completion.chunk" if chat else "text_completion"

            def send(obj: dict) -> None:
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

            start = time.monotonic()
            for i in range(tokens):
                time.sleep(max(0.0, start + i * itl - time.monotonic()))
                piece = {"delta": {"content": f" t{i}"}} if chat else {"text": f" t{i}"}
                send(
                    {
                        "object": kind,
                        "model": "standin",
                        "choices": [{"index": 0, **piece, "finish_reason": "length" if i == tokens - 1 else None}],
                    }
                )
            send(
                {
                    "object": kind,
                    "model": "standin",
                    "choices": [],
                    "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens},
                }
            )
            self.wfile.write(b"data: [DONE]\n\n")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if body.get("stream"):
                self._stream(body, chat=self.path.endswith("/chat/completions"))
                return
            answer = os.environ.get("STANDIN_ANSWER", "42")
            self._send(
                200,
                {
                    "object": "text_completion",
                    "model": "standin",
                    "choices": [{"index": 0, "text": f" {answer}", "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                },
            )

        def log_message(self, fmt: str, *args: object) -> None:
            return None

    return Handler


def main() -> None:
    rank = int(_arg("--node-rank", "0"))
    port = int(_arg("--port", "8000"))
    print(f"standin rank {rank}: argv {sys.argv[1:]}", flush=True)
    if os.environ.get("STANDIN_LEAK"):
        name = os.environ["STANDIN_LEAK"]
        token = os.environ.get(name, "")
        print(f"standin: using {name}={token} for downloads", flush=True)
        print(f"standin: sending Authorization: Bearer {token}", flush=True)
    only = os.environ.get("STANDIN_FAULT_RANK")  # faults hit only this rank when set
    orphan = os.environ.get("STANDIN_ORPHAN")
    if orphan in ("keep", "drop") and (only is None or int(only) == rank):
        import subprocess

        child = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env=None if orphan == "keep" else {"PATH": "/usr/bin:/bin"})  # fmt: skip
        print(f"standin: orphan pid {child.pid}", flush=True)
    faulty = only is None or int(only) == rank
    if faulty:
        time.sleep(float(os.environ.get("STANDIN_DELAY", "0")))
    if os.environ.get("STANDIN_LOG_LINE") and faulty:
        print(os.environ["STANDIN_LOG_LINE"], flush=True)
    if os.environ.get("STANDIN_EXIT") and faulty:
        print("standin: simulated failure", flush=True)
        sys.exit(int(os.environ["STANDIN_EXIT"]))
    if rank != 0:
        print("standin worker ready", flush=True)
        while True:
            time.sleep(3600)
    time.sleep(float(os.environ.get("STANDIN_HEAD_DELAY", "0")))
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("0.0.0.0", port), _handler())
    print("The server is fired up and ready to roll!", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
