"""A vLLM CPU deployment started with an API key (tests/e2e/conftest.py: `up --env VLLM_API_KEY`,
the value from up's environment): each command that talks to it sends the key from where the user
keeps it, fails in one line naming the missing key without it, and never shows or stores it.
(bench decode/prefill/serve and the greedy comparison send it in test_bench_engines.py,
test_bench_serve_engines.py and test_evals_engines.py; up's own smoke test needed it to pass; `ab` passing a
key to each variant's up and bench is test_llamacpp_native.py's keyed A/B.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import VLLM_KEY, VLLM_KEY_ENV, Served

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SUBSET = "format_one_word,format_python_list"


def _cli(state: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", VLLM_KEY_ENV)}
    clean.update(env or {}, SPARKFLEET_STATE_DIR=str(state), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True,
                          input=stdin, timeout=600, env=clean)  # fmt: skip


@pytest.mark.parametrize(
    "command",
    [
        ("bench", "decode", "--concurrency", "1", "--output-len", "4", "--repeats", "1"),
        ("bench", "serve", "--num-prompts", "2", "--output-len", "4"),
        ("eval", "quality", "--only", SUBSET),
    ],
    ids=["bench-decode", "bench-serve", "eval-quality"],
)
def test_without_the_key_each_command_fails_in_one_line_naming_it(
    vllm_url: str, tmp_path: Path, command: tuple[str, ...]
) -> None:
    out = _cli(tmp_path, *command[:2], vllm_url, *command[2:])
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert f"endpoint {vllm_url} wants an API key (HTTP 401)" in lines[0]
    assert "--api-key env:NAME, file:PATH or - (stdin), or set OPENAI_API_KEY" in lines[0]


def test_a_key_written_on_the_command_line_is_refused_unseen(vllm_url: str, tmp_path: Path) -> None:
    out = _cli(tmp_path, "bench", "decode", vllm_url, "--api-key", VLLM_KEY)
    assert out.returncode == 2 and "--api-key takes where the key is, not the key" in out.stderr, out.stderr
    assert VLLM_KEY not in out.stdout + out.stderr


def test_a_wrong_key_is_named_as_refused(vllm_url: str, tmp_path: Path) -> None:
    out = _cli(tmp_path, "bench", "decode", vllm_url, "--api-key", "env:WRONG", env={"WRONG": "sk-not-the-key"})
    assert out.returncode != 0 and f"endpoint {vllm_url} refused the API key given (HTTP 401)" in out.stderr


def test_bench_by_name_uses_the_deployments_own_key_and_keeps_it_nowhere(vllm_server: Served) -> None:
    # No flag, no OPENAI_API_KEY: the key rank 0 was started with, read back from its env file.
    out = _cli(vllm_server.state_dir, "bench", "decode", vllm_server.name, "--concurrency", "1", "--output-len", "8",
               "--repeats", "1", "--api", "completions", "--label", "keyed")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "prose/c1" in out.stdout
    shown = _cli(vllm_server.state_dir, "bench", "show", "last")
    for text in (out.stdout, out.stderr, shown.stdout):
        assert VLLM_KEY not in text
    for stored in vllm_server.state_dir.rglob("*"):
        if stored.is_file():
            assert VLLM_KEY.encode() not in stored.read_bytes(), stored


def test_eval_quality_reads_the_key_from_stdin(vllm_url: str, tmp_path: Path) -> None:
    out = _cli(tmp_path, "eval", "quality", vllm_url, "--only", SUBSET, "--api", "completions", "--api-key", "-",
               stdin=VLLM_KEY + "\n")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert re.search(r"\b[0-2]/2\b", out.stdout), out.stdout  # both tasks answered (the base model may fail them)
    assert VLLM_KEY not in out.stdout + out.stderr
