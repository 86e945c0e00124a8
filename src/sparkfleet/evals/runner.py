"""The quality run: every task, one request at a time, greedy, scored without a judge."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from sparkfleet.bench.chat_api import HINT
from sparkfleet.errors import EvalError
from sparkfleet.evals.checks import score
from sparkfleet.evals.client import COMPLETION_FRAME, Api, EvalClient
from sparkfleet.evals.results import CONTENT_KEEP, QualityRun, TaskResult
from sparkfleet.evals.sandbox import SandboxLimits, run_python
from sparkfleet.evals.tasks import Task

if TYPE_CHECKING:
    from sparkfleet.bench.endpoint import Endpoint
    from sparkfleet.state.store import Store

ApiChoice = Literal["auto", "chat", "completions"]
# Consecutive failed requests after which the server is taken to be gone.
MAX_REQUEST_ERRORS = 3


def choose_api(client: EvalClient, choice: ApiChoice) -> tuple[Api, str]:
    """The API to use and why: ``auto`` takes chat when a probe question gets an answer; ``chat``
    asked of a server that refuses it for want of a chat template is an error naming the way out."""
    if choice == "completions":
        return choice, "chosen by the user"
    problem = client.chat_probe()
    if choice == "chat":
        if problem is not None and HINT in problem:
            raise EvalError(f"{client.base_url}: {problem}")
        return choice, "chosen by the user"
    if problem is None:
        return "chat", "auto: the chat probe got an answer"
    return "completions", f"auto: {problem}"


def prompt_format(api: Api) -> str:
    """How prompts reach the model, in words, for the stored result."""
    if api == "chat":
        return "chat: /v1/chat/completions, the server's chat template, one user turn"
    frame = COMPLETION_FRAME.replace("\n", "\\n")
    return f"completions: /v1/completions, plain frame '{frame}', stop at '\\nQuestion:' or '\\nAnswer:'"


def new_run_id(kind: str) -> str:
    """A sortable, unique run id, e.g. ``q-20261129T093012-3fa1``."""
    return f"{kind}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}"


def run_task(
    client: EvalClient,
    api: Api,
    task: Task,
    *,
    thinking_budget: int = 0,
    limits: SandboxLimits | None = None,
) -> TaskResult:
    """Ask one task and score the answer (reasoning already removed by the client)."""
    budget = task.max_tokens + (thinking_budget if task.thinking and api == "chat" else 0)
    reply = client.ask(api, task.prompt, max_tokens=budget, thinking=task.thinking)
    verdict = score(task.category, task.check, reply.content, limits=limits)
    why = verdict.why
    if not verdict.passed and reply.finish_reason == "length":
        why += " (answer cut at max_tokens)"
    return TaskResult(
        id=task.id,
        category=task.category,
        passed=verdict.passed,
        why=why,
        thinking=task.thinking,
        finish_reason=reply.finish_reason,
        prompt_tokens=reply.prompt_tokens,
        completion_tokens=reply.completion_tokens,
        seconds=round(reply.seconds, 3),
        reasoning_chars=reply.reasoning_chars,
        content=reply.content[:CONTENT_KEEP],
    )


def run_quality(
    client: EvalClient,
    tasks: Sequence[Task],
    *,
    label: str,
    engine: str = "unknown",
    api_choice: ApiChoice = "auto",
    thinking_budget: int = 0,
    limits: SandboxLimits | None = None,
    on_result: Callable[[int, TaskResult], None] | None = None,
) -> QualityRun:
    """Run the tasks in order and return the whole run (not stored: the caller decides)."""
    if not tasks:
        raise EvalError("no tasks selected")
    run_id = new_run_id("q")
    probe = run_python("pass", limits)
    sandbox = probe.isolation
    code_tasks = [t.id for t in tasks if t.category == "code"]
    if code_tasks and not probe.isolated and not (limits and limits.unconfined_ok):
        raise EvalError(
            f"{len(code_tasks)} code task(s) run model-written code, and this machine gives the sandbox no "
            f"isolation ({probe.isolation}); nothing was run: leave code out (--categories) or, on a machine "
            "you can lose, pass --unsafe-unconfined-code"
        )
    api, why_api = choose_api(client, api_choice)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    results: list[TaskResult] = []
    errors = 0
    for i, task in enumerate(tasks):
        try:
            result = run_task(client, api, task, thinking_budget=thinking_budget, limits=limits)
            errors = 0
        except EvalError as exc:
            errors += 1
            if errors >= MAX_REQUEST_ERRORS:
                raise EvalError(f"{MAX_REQUEST_ERRORS} requests in a row failed; last: {exc}") from exc
            result = TaskResult(
                task.id,
                task.category,
                False,
                f"request failed: {exc}"[:300],
                task.thinking,
                "error",
                None,
                None,
                0.0,
                0,
                "",
            )
        results.append(result)
        if on_result:
            on_result(i, result)
    if api == "completions":
        thinking = "n/a (completions endpoint)"
    elif client.thinking_control is False:
        thinking = "refused by the server (chat_template_kwargs dropped)"
    else:
        thinking = "chat_template_kwargs.enable_thinking sent per task (the template may ignore it)"
    return QualityRun(
        id=run_id,
        label=label or run_id,
        endpoint=client.base_url,
        model=client.model,
        engine=engine,
        api=api,
        prompt_format=f"{prompt_format(api)} ({why_api})",
        thinking_control=thinking,
        sandbox=sandbox,
        started_utc=started,
        wall_s=round(time.monotonic() - t0, 1),
        results=tuple(results),
    )


def run_stored(
    endpoint: Endpoint,
    tasks: Sequence[Task],
    *,
    label: str,
    store: Store | None = None,
    timeout: float = 600.0,
    api_choice: ApiChoice = "auto",
    thinking_budget: int = 0,
    limits: SandboxLimits | None = None,
    on_result: Callable[[int, TaskResult], None] | None = None,
) -> QualityRun:
    """``run_quality`` against endpoint, then the run saved to the store (``sparkfleet eval
    quality`` and ``ab`` both run quality this way)."""
    from sparkfleet.evals.store import save
    from sparkfleet.state.store import Store

    client = EvalClient(endpoint.base_url, endpoint.model, api_key=endpoint.api_key, timeout=timeout)
    try:
        run = run_quality(client, tasks, label=label, engine=endpoint.engine, api_choice=api_choice,
                          thinking_budget=thinking_budget, limits=limits, on_result=on_result)  # fmt: skip
    finally:
        client.close()
    save(store or Store(), "quality", run)
    return run
