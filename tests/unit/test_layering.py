"""The layering docs/architecture.md states is the import-linter contracts of pyproject.toml, and
they hold (the same check scripts/test.sh runs as ``lint-imports``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout[-2000:]
    for contract in ("nodes/ is below the workflows", "plan/ and config/ never execute", "only cli/ imports cli/",
                     "apply/ reaches nodes through the seam"):  # fmt: skip
        assert contract in " ".join(done.stdout.split()), contract
