"""Command-line mistakes (unknown command or option, missing argument, bad value) are one line on
stderr and exit 2, with or without click installed; asking for nothing shows the help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli_run import run_main


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (("bogus",), "No such command 'bogus'"),
        (("plan",), "plan: Missing argument 'recipe'"),
        (("plan", "--bogus"), "No such option: --bogus"),
        (("--bogus",), "No such option: --bogus"),
        (("bench", "export"), "bench export: Missing argument 'run'"),
        (("dashboard", "--port", "abc"), "Invalid value for '--port'"),
    ],
    ids=["command", "argument", "option", "global-option", "subcommand-argument", "value"],
)
def test_usage_mistake_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], expect: str
) -> None:
    code, out, err = run_main(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and expect in err
    assert "--help" in err  # where to look next


@pytest.mark.parametrize("argv", [(), ("bench",)], ids=["root", "group"])
def test_asking_for_nothing_shows_help_on_stdout(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    code, out, err = run_main(capsys, *argv)
    assert code == 0 and "Usage:" in out and err == ""


def test_mistakes_need_no_click_module() -> None:
    # typer >= 0.29 vendors click; a bare install has no click package at all.
    code = "import sys; sys.modules['click'] = None; from sparkfleet.cli.main import main; main(sys.argv[1:])"
    for argv in (["bogus"], ["plan"], ["plan", "--bogus"]):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def test_extras_are_named_before_any_work(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    # No run is stored and no server answers: the missing extra is still the error shown.
    code, _, err = run_main(capsys, "bench", "export", "last", "--format", "png")
    assert code == 2 and "pip install 'sparkfleet[plots]'" in err and len(err.splitlines()) == 1
    code, _, err = run_main(capsys, "eval", "needle", "http://127.0.0.1:9", "--png", "h.png")
    assert code == 2 and "pip install 'sparkfleet[plots]'" in err


@pytest.mark.parametrize(
    "argv",
    [
        ("bench", "decode", "http://127.0.0.1:9", "--model", "m", "--api", "chatty"),
        ("bench", "serve", "http://127.0.0.1:9", "--model", "m", "--api", "chatty"),
        ("ab", "examples/gemma-llamacpp", "--variants", "base,fast", "--api", "chatty"),
    ],
    ids=["bench-decode", "bench-serve", "ab"],
)
def test_a_bad_api_is_refused_by_the_config_in_one_line(capsys: pytest.CaptureFixture[str],
                                                        argv: tuple[str, ...]) -> None:  # fmt: skip
    # One check (bench.client.check_api) in the configs the commands build, before any request.
    code, _, err = run_main(capsys, *argv)
    assert code == 2 and err.strip() == "error: --api must be chat or completions, not 'chatty'"
