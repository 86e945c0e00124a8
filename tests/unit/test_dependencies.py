"""Dependencies as a user gets them: no private module of one imported (`typer._click` changes
without notice between releases, the public API does not), every one declared with bounds, the
tested versions pinned for the set-up scripts."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_private_module_of_a_dependency_is_imported() -> None:
    found = []
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top, *rest = name.split(".")
                if (
                    top != "sparkfleet"
                    and top != "tests"
                    and any(p.startswith("_") and p != "__future__" for p in rest)
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert found == []


def test_every_package_a_script_installs_is_declared_with_the_same_bounds() -> None:
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    spec = re.search(r'PLAYWRIGHT_SPEC="([^"]+)"', (ROOT / "scripts" / "setup-browser.sh").read_text())
    assert spec is not None and extras["browser"] == [spec.group(1)]
    # The project's venv installs from the tested versions.
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert '-c "$root/constraints.txt" -e "$root[dev]"' in setup
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pinned = {line.split("==")[0].lower().replace("_", "-") for line in lines if "==" in line}
    for name in ("typer", "rich", "pydantic", "httpx", "prometheus-client", "pytest", "openai", "playwright"):
        assert name in pinned, name
