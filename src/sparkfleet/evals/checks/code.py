"""Code tasks: the model's function, then hidden asserts, run in the sandbox."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any

from sparkfleet.evals.extract import extract_code
from sparkfleet.evals.sandbox import SandboxLimits, run_python
from sparkfleet.evals.verdict import Verdict

_LINE = re.compile(r'File "<string>", line (\d+)')


def validate(spec: Mapping[str, Any]) -> None:
    """``entry`` names the function, ``tests`` holds the assert lines."""
    for key in ("entry", "tests"):
        if not isinstance(spec.get(key), str) or not spec[key].strip():
            raise ValueError(f"code check needs a non-empty string '{key}'")
    try:
        compile(spec["tests"], "<tests>", "exec")
    except SyntaxError as exc:
        raise ValueError(f"tests line {exc.lineno}: {exc.msg}") from exc


def _failure_reason(stderr: str, program: list[str]) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    if not lines:
        return "exited non-zero with no message"
    last = lines[-1].strip()
    hits = _LINE.findall(stderr)
    if hits:
        n = int(hits[-1])
        if 1 <= n <= len(program):
            return f"{last[:160]} at: {program[n - 1].strip()[:160]}"
    return last[:240]


def score(spec: Mapping[str, Any], answer: str, *, limits: SandboxLimits | None = None) -> Verdict:
    """Pass when the extracted code defines the entry point and every hidden assert holds."""
    code = extract_code(answer)
    entry = spec["entry"]
    if not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        return Verdict.fail(f"no function named {entry}")
    # A fresh token the model cannot have printed: only reaching the end of the asserts prints it.
    token = "HARNESS_OK_" + secrets.token_hex(8)
    program = f"{code}\n\n{spec['tests'].strip()}\nprint({token!r})\n"
    run = run_python(program, limits)
    if not run.ran:
        return Verdict.fail(f"not run: {run.isolation}")
    if run.timed_out:
        return Verdict.fail("timeout (wall clock)")
    if run.exit_code == 0 and token in run.stdout:
        return Verdict.ok("all asserts passed")
    if run.signal is not None:
        return Verdict.fail(f"killed by signal {run.signal} (CPU, memory or file-size limit)")
    if run.exit_code == 0:
        return Verdict.fail("exited before the asserts finished")
    return Verdict.fail(_failure_reason(run.stderr, program.splitlines()))
