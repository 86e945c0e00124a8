"""A server that answers everything with hostile code must score nothing (issue 13).

A literal in a program is not an answer: `while True: x.append(bytearray(10**8))` once "passed"
a task whose answer is 8. The corpus below builds, for every task, programs and code spans that
contain that task's own expected answer, and every one of them must fail. The last tests run the
whole shipped task set through the real runner against an in-process server (httpx.MockTransport)
whose every reply is such a program; code tasks really run in the sandbox, under tight limits.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from sparkfleet.evals import checks
from sparkfleet.evals.checks import code as code_check
from sparkfleet.evals.checks import score
from sparkfleet.evals.client import EvalClient
from sparkfleet.evals.runner import run_quality
from sparkfleet.evals.sandbox import SandboxLimits, SandboxResult
from sparkfleet.evals.tasks import Task, load_tasks
from tests.unit.test_evals_reference_answers import CODE, FORMAT, JSON_RIGHT, PROSE_RIGHT

TASKS = load_tasks()
NUMERIC = [t for t in TASKS if t.category in ("math", "reasoning") and "answer" in t.check]
WORDED = [t for t in TASKS if t.category in ("math", "reasoning") and "word" in t.check]
JSON_TASKS = [t for t in TASKS if t.category == "json"]
# Tight enough that a runaway allocation fails in a fraction of a second, so the whole hostile
# run stays fast; the point is that the sandbox is always asked with limits, never without.
TIGHT = SandboxLimits(wall_s=5.0, cpu_s=1, memory_mb=128)

# {s}: the task's expected number; {lo}/{hi}: its neighbours. No prose part has a digit, so
# nothing but the code could supply the number.
NUMERIC_CODE: list[tuple[str, str]] = [
    ("the issue's reply: an exponent", "```python\nx = []\nwhile True:\n    x.append(bytearray(10**{s}))\n```"),
    ("the same program unfenced", "x = []\nwhile True:\n    x.append(bytearray(10**{s}))"),
    ("python fence, assigned and printed", "```python\nanswer = {s}\nprint(answer)\n```"),
    ("py tag, an assert", "```py\nassert solve() == {s}\n```"),
    ("unlabelled fence, the number alone", "Answer:\n```\n{s}\n```"),
    ("~~~ fence with a tag", "~~~python\nn = {s}\nwhile n:\n    n = n * 2\n~~~"),
    ("~~~ fence without a tag", "~~~\nresult = {s}\n~~~"),
    ("four-backtick fence", "````python\nx = {s}\n````"),
    ("fence tag with attributes", '```python title="hog.py"\nimport os\nwhile True:\n    os.fork()  # {s}\n```'),
    ("fence opened mid-line", "Sure! ```python\nx = {s}\nwhile True: pass\n```"),
    ("unclosed fence (cut off)", "Here you go:\n```python\nresult = {s}\nwhile True:\n    result **= 2"),
    ("unclosed ~~~ fence", "~~~\n{s}"),
    ("bold cue inside code", "```\n**Answer: {s}**\n```"),
    ("boxed inside code", "```latex\n\\boxed{{{s}}}\n```"),
    ("= inside code, prose after", "```python\ntotal = {s}\n```\nThe code sets the total."),
    ("cue outside, number only in code", "Final answer:\n```python\nwhile True:\n    x = {s}\n```"),
    ("a list of numbers in code", "```python\nnums = [{lo}, {s}, {hi}]\nprint(sum(nums))\n```"),
    ("a range in code", "```python\nprint(list(range({lo}, {s})))\n```"),
    ("a list of numbers inline", "Candidates: `[{lo}, {s}, {hi}]`"),
    ("inline code alone", "`{s}`"),
    ("inline code after a cue", "The answer is `{s}`."),
    ("bold inline code", "**`{s}`**"),
    ("double-backtick inline code", "Final answer: ``x = {s}``"),
    ("triple backticks inline", "```{s}```"),
    ("inline exponent", "Allocate `bytearray(10**{s})` in a loop."),
    ("bare exponent", "x = 10**{s}"),
    ("bare program in paragraphs", "import os\n\nx = {s}\n\nwhile True:\n    os.fork()"),
    ("bare function", "def solve():\n    return {s}\n\nsolve()"),
    ("one-liner in a fence", "```\nx = {s}; exec('while True: pass')\n```"),
]
WORD_CODE: list[tuple[str, str]] = [
    ("python fence", "```python\nprint({w!r})\n```"),
    ("unlabelled fence", "```\n{w}\n```"),
    ("~~~ fence", "~~~\nanswer = '{w}'\n~~~"),
    ("unclosed fence", "```python\nanswer = '{w}'\nwhile True:\n    pass"),
    ("inline code", "`{w}`"),
    ("inline code after a cue", "The answer is `{w}`."),
    ("bare program", "answer = '{w}'\nwhile True:\n    pass"),
]
JSON_CODE: list[tuple[str, str]] = [
    ("python fence", "```python\ndata = {d}\nwhile True:\n    data = [data, data]\n```"),
    ("unlabelled fence", "```\nimport json\nprint(json.dumps({d}))\n```"),
    ("~~~ fence", "~~~python\nDATA = {d}\n~~~"),
    ("unclosed fence", "```python\nresult = {d}\nwhile True:\n    pass"),
    ("inline code", "Run `x = {d}` first."),
    ("bare program", "data = {d}\nwhile True:\n    pass"),
]


def _numbers(task: Task) -> dict[str, str]:
    value = float(task.check["answer"])
    return {"s": f"{value:g}", "lo": f"{value - 1:g}", "hi": f"{value + 1:g}"}


def _all_fail(task: Task, corpus: list[tuple[str, str]], fill: Callable[[str], str]) -> list[str]:
    """The corpus entries this task wrongly accepts (each built to hold its own right answer)."""
    accepted = []
    for name, template in corpus:
        answer = fill(template)
        verdict = score(task.category, task.check, answer)
        if verdict.passed:
            accepted.append(f"{name}: {answer!r} ({verdict.why})")
    return accepted


def test_the_corpus_covers_the_task_set() -> None:
    assert len(NUMERIC) >= 20 and len(WORDED) >= 5 and len(JSON_TASKS) >= 10
    # The number really is in the code: a corpus that dropped it would prove nothing.
    for task in NUMERIC:
        for _, template in NUMERIC_CODE:
            assert _numbers(task)["s"] in template.format(**_numbers(task))


@pytest.mark.parametrize("task_id", [t.id for t in NUMERIC])
def test_numbers_inside_code_are_never_the_answer(task_id: str) -> None:
    task = next(t for t in NUMERIC if t.id == task_id)
    nums = _numbers(task)
    assert _all_fail(task, NUMERIC_CODE, lambda t: t.format(**nums)) == []


@pytest.mark.parametrize("task_id", [t.id for t in NUMERIC])
def test_the_same_number_said_in_prose_still_passes(task_id: str) -> None:
    task = next(t for t in NUMERIC if t.id == task_id)
    s = _numbers(task)["s"]
    legit = [
        f"The answer is {s}.",
        f"**{s}**",
        f"Answer: {s}",
        f"x = {s}",
        f"**Answer: {s}**",
        f"A check:\n```python\nprint(10**9)\n```\nThe answer is {s}.",
        f"**Final answer: {s}**\n\n```python\nx = []\nwhile True:\n    x.append(bytearray(10**9))\n```",
    ]
    for answer in legit:
        verdict = score(task.category, task.check, answer)
        assert verdict.passed, f"{task_id} rejected {answer!r}: {verdict.why}"


@pytest.mark.parametrize("task_id", [t.id for t in WORDED])
def test_words_inside_code_are_never_the_answer(task_id: str) -> None:
    task = next(t for t in WORDED if t.id == task_id)
    word = str(task.check["word"])
    assert _all_fail(task, WORD_CODE, lambda t: t.format(w=word)) == []
    assert score(task.category, task.check, f"```python\nx = 1\n```\nThe answer is {word}.").passed


@pytest.mark.parametrize("task_id", [t.id for t in JSON_TASKS])
def test_a_program_holding_the_document_is_not_json(task_id: str) -> None:
    task = next(t for t in JSON_TASKS if t.id == task_id)
    doc = json.dumps(JSON_RIGHT[task_id])
    assert _all_fail(task, JSON_CODE, lambda t: t.format(d=doc)) == []
    # The document itself, fenced or inline, is still an answer.
    assert score(task.category, task.check, f"```json\n{doc}\n```").passed
    assert score(task.category, task.check, f"Here it is: `{doc}`").passed


def hostile(task: Task, index: int) -> str:
    """A program that allocates without end and holds the task's expected answer as a literal."""
    hog = "hog = []\nwhile True:\n    hog.append(bytearray(10**8))\n"
    if task.category == "code":
        entry = task.check["entry"]
        variants = [
            # Named like the entry point, so it reaches the sandbox, and never returns.
            f"def {entry}(*args, **kwargs):\n" + "".join(f"    {ln}\n" for ln in hog.splitlines()),
            # The right solution in a string: the def is there to see but never runs.
            f"REFERENCE = '''\n{CODE[task.id].strip()}\n'''\n{hog}",
            # No function at all: the checker refuses it before any sandbox.
            hog,
        ]
        body = variants[index % len(variants)]
    elif task.category in ("math", "reasoning"):
        literal = f"{task.check['answer']:g}" if "answer" in task.check else repr(task.check["word"])
        body = f"answer = {literal}\n{hog}"
    elif task.category == "json":
        body = f"answer = {json.dumps(JSON_RIGHT[task.id])}\n{hog}"
    elif task.category == "format":
        body = f"answer = {FORMAT[task.id][0]!r}\n{hog}"
    else:
        body = f'answer = """{PROSE_RIGHT}"""\n{hog}'
    return f"```python\n{body}```\n"


def hostile_server(tasks: list[Task]) -> httpx.MockTransport:
    """An OpenAI-style chat server, in process, that answers every task with ``hostile``."""
    index = {t.prompt: (i, t) for i, t in enumerate(tasks)}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions":
            return httpx.Response(404, json={})
        prompt = json.loads(request.content)["messages"][0]["content"]
        # The chat probe is not a task: a plain answer keeps the run on the chat API.
        content = hostile(index[prompt][1], index[prompt][0]) if prompt in index else "5"
        usage = {"prompt_tokens": 10, "completion_tokens": 50}
        choice = {"message": {"content": content}, "finish_reason": "stop"}
        return httpx.Response(200, json={"choices": [choice], "usage": usage})

    return httpx.MockTransport(handle)


def _client(tasks: list[Task]) -> EvalClient:
    client = EvalClient("http://hostile.invalid", "hostile")
    client.http.close()
    client.http = httpx.Client(transport=hostile_server(tasks), timeout=5.0)
    return client


def test_a_server_answering_only_hostile_code_passes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxed: list[SandboxLimits | None] = []
    real_run = code_check.run_python

    def spy(program: str, limits: SandboxLimits | None = None) -> SandboxResult:
        sandboxed.append(limits)
        return real_run(program, limits)

    monkeypatch.setattr(code_check, "run_python", spy)
    client = _client(TASKS)
    try:
        run = run_quality(client, TASKS, label="hostile", api_choice="auto", limits=TIGHT)
    finally:
        client.close()
    print(f"hostile run: {run.passed}/{run.total} tasks passed")
    assert run.api == "chat"
    assert run.total == len(TASKS) >= 75
    passed = [f"{r.id}: {r.why}" for r in run.results if r.passed]
    assert passed == [], f"{len(passed)} of {run.total} hostile answers passed"
    assert run.passed == 0

    by_id = {r.id: r for r in run.results}
    # Not merely a wrong number: no number at all is read out of a program.
    for task in NUMERIC:
        assert by_id[task.id].why == "no number in the answer", (task.id, by_id[task.id].why)
    for task in WORDED:
        assert by_id[task.id].why == "none of the options named", (task.id, by_id[task.id].why)
    code_tasks = [t for t in TASKS if t.category == "code"]
    # Two of every three code answers name the entry point and run; each run had the limits.
    assert len(sandboxed) == sum(1 for i, t in enumerate(TASKS) if t.category == "code" and i % 3 != 2)
    assert sandboxed and all(limits is TIGHT for limits in sandboxed)
    for task in code_tasks:
        why = by_id[task.id].why
        assert "MemoryError" in why or "no function named" in why or "signal" in why, (task.id, why)


def test_a_hostile_entry_point_that_spins_is_stopped_by_the_cpu_limit() -> None:
    task = next(t for t in TASKS if t.category == "code")
    entry = task.check["entry"]
    answer = f"```python\ndef {entry}(*args, **kwargs):\n    while True:\n        pass\n```"
    verdict = checks.score("code", task.check, answer, limits=TIGHT)
    assert not verdict.passed
    assert "signal" in verdict.why or "timeout" in verdict.why, verdict.why
