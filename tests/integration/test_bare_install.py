"""A bare ``pip install`` (no extras) answers every user mistake with exit 2 and one line, no
traceback: scripts/check-bare-install.sh builds that venv and runs the cases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-bare-install.sh"


@pytest.mark.integration
@pytest.mark.slow
def test_bare_install_answers_mistakes_in_one_line() -> None:
    # This interpreter's version, so the bare venv runs what the suite runs.
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("bare install: ") and "cases passed" in summary, report
    passed, total = summary.removeprefix("bare install: ").split()[0].split("/")
    assert passed == total and int(total) >= 30, report
