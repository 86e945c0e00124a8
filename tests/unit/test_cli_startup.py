"""The lifecycle and planning commands start fast: they never import the heavy libraries that
bench, eval or the dashboard need."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("numpy", "matplotlib", "starlette", "uvicorn", "safetensors")


@pytest.mark.parametrize("command", ["plan", "validate", "status", "up", "down", "logs"])
def test_command_imports_only_what_it_needs(command: str) -> None:
    code = (
        "import sys; from sparkfleet.cli.main import build_app; "
        f"build_app([{command!r}]); print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_help_lists_every_command_group() -> None:
    out = subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for name in ("validate", "plan", "up", "down", "status", "logs"):
        assert name in out.stdout
