"""docs/architecture.md names, beside each contract it states, the test that checks it: every test
it names exists (a renamed or removed test makes the doc's claim unchecked)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
CITED = re.compile(r"(tests/(?:unit|integration|e2e)/test_\w+\.py)(?:::(\w+))?")


def test_every_test_the_architecture_names_exists() -> None:
    cited = CITED.findall(DOC.read_text(encoding="utf-8"))
    assert len(cited) > 50
    missing = []
    for path, name in cited:
        file = ROOT / path
        if not file.is_file():
            missing.append(path)
            continue
        tests = {n.name for n in ast.walk(ast.parse(file.read_text(encoding="utf-8")))
                 if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}  # fmt: skip
        if (name and name not in tests) or (not name and not tests):
            missing.append(f"{path}::{name}")
    assert missing == []
