"""The quality run, storage, show and compare end to end against a scripted OpenAI-style server.

The server is real HTTP on a real socket; what it answers is scripted per task (it looks the
task up by its prompt), so the scores and flips are known in advance. The real engines are in
tests/e2e.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sparkfleet.cli.main import main
from sparkfleet.evals.client import COMPLETION_FRAME, EvalClient
from sparkfleet.evals.results import QualityRun
from sparkfleet.evals.runner import run_quality
from sparkfleet.evals.store import load_run
from sparkfleet.evals.tasks import Task, load_tasks
from sparkfleet.state.store import Store

TASKS = load_tasks(categories=["math", "reasoning"])
BY_PROMPT = {t.prompt: t for t in TASKS}


def right(task: Task) -> str:
    return str(task.check.get("word", task.check.get("answer")))


Answerer = Callable[[Task], str]


@contextmanager
def scripted_server(answer: Answerer, *, chat: str = "ok", seen: list[dict[str, Any]] | None = None) -> Iterator[str]:
    """chat: "ok" answers chat, "empty" answers chat with nothing, "strict" refuses chat_template_kwargs."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, {"data": [{"id": "scripted", "owned_by": "vllm"}]})
            else:
                self._send(404, {})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if seen is not None:
                seen.append({"path": self.path, **body})
            usage = {"prompt_tokens": 10, "completion_tokens": 5}
            if self.path == "/v1/chat/completions":
                if chat == "strict" and "chat_template_kwargs" in body:
                    self._send(400, {"error": "extra field chat_template_kwargs"})
                    return
                prompt = body["messages"][0]["content"]
                task = BY_PROMPT.get(prompt)
                text = "" if chat == "empty" or task is None else answer(task)
                message = {"content": f"<think>hmm</think>{text}", "reasoning_content": "step by step"}
                if chat == "empty":
                    message = {"content": ""}
                self._send(200, {"choices": [{"message": message, "finish_reason": "stop"}], "usage": usage})
            elif self.path == "/v1/completions":
                prompt = body["prompt"]
                inner = prompt[len("Question: ") : -len("\nAnswer:")]
                task = BY_PROMPT.get(inner)
                text = f" {answer(task)}" if task else ""
                self._send(200, {"choices": [{"text": text, "finish_reason": "stop"}], "usage": usage})
            else:
                self._send(404, {})

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_chat_run_strips_reasoning_and_sends_thinking_per_task() -> None:
    seen: list[dict[str, Any]] = []
    with scripted_server(right, seen=seen) as url:
        client = EvalClient(url, "scripted")
        run = run_quality(client, TASKS, label="chat")
    assert run.api == "chat"
    assert (run.passed, run.total) == (len(TASKS), len(TASKS))
    assert all(r.reasoning_chars > 0 for r in run.results)
    asks = [b for b in seen if b.get("max_tokens", 0) > 16]
    assert all(b["temperature"] == 0 for b in asks)
    thinking = {b["messages"][0]["content"]: b["chat_template_kwargs"]["enable_thinking"] for b in asks}
    assert thinking == {t.prompt: t.thinking for t in TASKS}


def test_base_model_without_chat_gets_the_completions_frame() -> None:
    seen: list[dict[str, Any]] = []
    with scripted_server(right, chat="empty", seen=seen) as url:
        run = run_quality(EvalClient(url, "scripted"), TASKS, label="base")
    assert run.api == "completions"
    assert "empty answer" in run.prompt_format
    assert run.thinking_control.startswith("n/a")
    assert run.passed == len(TASKS)
    completions = [b for b in seen if b["path"] == "/v1/completions"]
    assert completions[0]["prompt"] == COMPLETION_FRAME.format(prompt=TASKS[0].prompt)


def test_a_server_that_refuses_thinking_control_is_asked_without_it() -> None:
    seen: list[dict[str, Any]] = []
    with scripted_server(right, chat="strict", seen=seen) as url:
        run = run_quality(EvalClient(url, "scripted"), TASKS[:3], label="strict", api_choice="chat")
    assert run.passed == 3
    assert run.thinking_control.startswith("refused")
    assert "chat_template_kwargs" not in seen[-1]


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr()
    return capsys.readouterr().out


def test_cli_quality_store_show_and_compare(capsys: pytest.CaptureFixture[str]) -> None:
    broken = {t.id for t in TASKS if t.category == "math"}  # 14 math tasks break in B

    def worse(task: Task) -> str:
        return "I don't know" if task.id in broken else right(task)

    with scripted_server(right) as url:
        out = _cli(["eval", "quality", url, "--categories", "math,reasoning", "--label", "base"], capsys)
    assert f"{len(TASKS)}/{len(TASKS)} passed" in out
    with scripted_server(worse) as url:
        _cli(["eval", "quality", url, "--categories", "math,reasoning", "--label", "cand"], capsys)

    stored = QualityRun.from_json(load_run(Store(), "cand", "quality"))
    assert stored.passed == len(TASKS) - len(broken)
    assert "no function" not in json.dumps(stored.to_json())

    same = _cli(["eval", "compare", "base", "base"], capsys)
    assert "no difference" in same and "p = 1" in same
    assert "BROKE" not in same

    diff = _cli(["eval", "compare", "base", "cand"], capsys)
    assert diff.count("BROKE") == len(broken)
    assert "NOT NOISE: B is worse" in diff

    listing = _cli(["eval", "show"], capsys)
    assert "base" in listing and "cand" in listing
    shown = _cli(["eval", "show", "cand"], capsys)
    assert "FAIL" in shown and "math_lcm" in shown


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["eval", "compare", "nope", "nada"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no quality run with id or label 'nope'" in err
    with pytest.raises(SystemExit) as exc:
        main(["eval", "quality", "http://127.0.0.1:9", "--categories", "math"])
    assert exc.value.code == 2
    assert "not answering" in capsys.readouterr().err
