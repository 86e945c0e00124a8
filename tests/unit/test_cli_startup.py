"""The CLI starts fast: lifecycle and planning commands never import the heavy libraries that
bench, eval or the dashboard need, and every `--help` loads only a small set of modules on top of
typer itself. Module counts, not timings: a count does not depend on the machine's load
(benchmarks/cli_startup.py prints the seconds)."""

from __future__ import annotations

import functools
import subprocess
import sys
from typing import Any

import pytest
import typer.main
from typer.core import TyperGroup

from sparkfleet.cli.main import build_app

HEAVY = ("numpy", "matplotlib", "starlette", "uvicorn", "safetensors")
# Never needed to print help: each of these costs 50-250 ms of start-up on its own.
NOT_FOR_HELP = ("pydantic", "httpx", "numpy", "asyncio", "sqlite3", "typer.rich_utils", "rich.markdown",
                "sparkfleet.plan", "sparkfleet.config.recipe", "sparkfleet.apply", "sparkfleet.nodes")  # fmt: skip
# Modules a `--help` may load beyond typer and rich's console (the floor of any command).
HELP_BUDGET = 60


def _paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            found += _paths(sub, (*path, name))
    return found


EVERY_COMMAND = _paths(typer.main.get_command(build_app()))


@functools.cache
def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return set(out.stdout.split())


@pytest.mark.parametrize("command", ["plan", "validate", "status", "up", "down", "logs"])
def test_command_imports_only_what_it_needs(command: str) -> None:
    code = (
        "import sys; from sparkfleet.cli.main import build_app; "
        f"build_app([{command!r}]); print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("path", EVERY_COMMAND, ids=lambda p: " ".join(p) or "root")
def test_help_stays_within_its_import_budget(path: tuple[str, ...]) -> None:
    floor = _modules_after("import typer, rich.console")
    loaded = _modules_after(
        "import contextlib, io, sys\nfrom sparkfleet.cli.main import main\n"
        f"with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main([*{list(path)!r}, '--help'])"
    )
    heavy = sorted(m for m in loaded if m in NOT_FOR_HELP or m.startswith(tuple(h + "." for h in NOT_FOR_HELP)))
    assert heavy == [], f"`sparkfleet {' '.join(path)} --help` imports {heavy}"
    extra = loaded - floor
    assert len(extra) <= HELP_BUDGET, (
        f"`sparkfleet {' '.join(path)} --help` loads {len(extra)} modules beyond typer (budget "
        f"{HELP_BUDGET}): {sorted(extra)}"
    )


def test_help_lists_every_command_and_nothing_else() -> None:
    out = subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    listed = [line.split()[0] for line in out.stdout.split("Commands:")[1].splitlines() if line.strip()]
    assert sorted(listed) == sorted(p[0] for p in EVERY_COMMAND if len(p) == 1)
