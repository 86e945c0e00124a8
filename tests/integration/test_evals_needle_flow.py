"""The needle grid and the memory guard together, against a scripted server over real HTTP.

The server "reads" the prompt like a perfect (or a short-sighted) model: it finds the asked key
and answers with the code next to it, so the grid's outcome is known in advance.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sparkfleet.evals.client import EvalClient
from sparkfleet.evals.heatmap import write_heatmap
from sparkfleet.evals.memguard import MemGuard, read_mem_available, sglang_abort
from sparkfleet.evals.needle import run_needle
from sparkfleet.nodes.transport.local import LocalTransport
from tests.json_http import JsonHandler, serving


@contextmanager
def reader_server(window: int | None, seen: list[dict[str, Any]]) -> Iterator[str]:
    """window: only the last ``window`` characters of the prompt are "read" (None: all of it)."""

    class Handler(JsonHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, **body})
            if self.path == "/tokenize":
                self._send({"count": len(body["prompt"]) // 4})
                return
            if self.path == "/abort_request":
                self._send({})
                return
            prompt = body["messages"][0]["content"] if "messages" in body else body["prompt"]
            key = re.search(r"access code for the (\S+) vault\?", prompt).group(1)  # type: ignore[union-attr]
            visible = prompt if window is None else prompt[-window:]
            found = re.search(rf"access code for the {re.escape(key)} vault is (\d{{7}})", visible)
            text = found.group(1) if found else "I could not find it."
            usage = {"prompt_tokens": len(prompt) // 4, "completion_tokens": 3}
            choice = {"message": {"content": text}, "text": text, "finish_reason": "stop"}
            self._send({"choices": [choice], "usage": usage})

    with serving(Handler) as url:
        yield url


def test_a_perfect_reader_passes_every_cell(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    with reader_server(None, seen) as url:
        run = run_needle(EvalClient(url, "m"), lengths=(1000, 4000), depths=(0, 50, 100), seed=7)
    assert run.total == 6 and run.passed == 6
    assert run.effective_length == 4000
    assert run.token_counting.startswith("server tokenizer")
    for cell in run.cells:
        assert abs((cell.tokens or 0) - cell.length) <= max(8, cell.length // 100)
    assert len({c.expected for c in run.cells}) == 6 and len({c.key for c in run.cells}) >= 5
    png = write_heatmap(run, tmp_path / "grid.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_short_sighted_reader_fails_deep_needles_and_lengths_cap_at_the_context() -> None:
    seen: list[dict[str, Any]] = []
    with reader_server(6000, seen) as url:
        run = run_needle(EvalClient(url, "m"), lengths=(1000, 4000, 100_000), depths=(0, 100), seed=3, context=8192)
    assert run.skipped_lengths == (100_000,)
    assert run.cell(1000, 0).passed and run.cell(1000, 100).passed  # type: ignore[union-attr]
    assert not run.cell(4000, 0).passed and run.cell(4000, 100).passed  # type: ignore[union-attr]
    assert run.effective_length == 1000


def test_the_memory_guard_aborts_and_stops_the_grid() -> None:
    seen: list[dict[str, Any]] = []
    floor = read_mem_available(LocalTransport()) + 64 * 1024**3  # above what this machine has
    with reader_server(None, seen) as url:
        guard = MemGuard([LocalTransport("head")], floor, [sglang_abort(url)], interval_s=0.2)
        run = run_needle(EvalClient(url, "m"), lengths=(1000,), depths=(0, 100), seed=1, guard=guard)
    assert run.cells == ()  # nothing asked once the guard tripped
    assert [b for b in seen if b["path"] == "/abort_request"] == [{"path": "/abort_request", "abort_all": True}]
    assert any(line.startswith("head: MemAvailable low-water") for line in run.memguard)
    assert any("TRIPPED on head" in line for line in run.memguard)
