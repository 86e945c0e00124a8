"""Shared fixtures: paths to the seed recipes and example clusters, golden-file updating.

Plugins: tests/skip_gate.py lists every test that did not run at the end of each run and, under
``CI=true``, fails the run for any not in tests/skip-allowlist.txt; ``pytester`` is for its tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ROOT / "tests" / "data" / "seeds"
SHARED_SEEDS = ROOT.parent / "shared" / "seeds" / "launcher" / "recipes"
SPARK4 = ROOT / "examples" / "clusters" / "spark4.toml"

pytest_plugins = ["pytester", "tests.skip_gate"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="Rewrite golden files from current output.")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own state dir, so no test sees another's deployments."""
    monkeypatch.setenv("SPARKFLEET_STATE_DIR", str(tmp_path_factory.mktemp("state")))
