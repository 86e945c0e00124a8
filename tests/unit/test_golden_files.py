"""Golden files are reviewed baselines: a missing one fails, only --update-golden writes one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.unit import test_seed_recipes

NAME = "dsv41-flash-4x-mia"


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "tests" / "golden").mkdir(parents=True)
    monkeypatch.setattr(test_seed_recipes, "ROOT", tmp_path)
    return tmp_path


def test_a_missing_golden_fails_and_is_not_written(fake_root: Path) -> None:
    golden = fake_root / "tests" / "golden" / f"{NAME}.plan.json"
    with pytest.raises(
        pytest.fail.Exception, match=r"plan.json is missing: review the plan, then rerun with --update-golden"
    ):
        test_seed_recipes.test_plan_json_matches_golden(NAME, update_golden=False)
    assert not golden.exists()


def test_update_golden_writes_it(fake_root: Path) -> None:
    golden = fake_root / "tests" / "golden" / f"{NAME}.plan.json"
    test_seed_recipes.test_plan_json_matches_golden(NAME, update_golden=True)
    assert golden.read_text() == (ROOT / "tests" / "golden" / f"{NAME}.plan.json").read_text()


def test_a_changed_golden_fails(fake_root: Path) -> None:
    golden = fake_root / "tests" / "golden" / f"{NAME}.plan.json"
    shutil.copyfile(ROOT / "tests" / "golden" / f"{NAME}.plan.json", golden)
    golden.write_text(golden.read_text().replace('"tp": 4', '"tp": 8', 1) + " ")
    with pytest.raises(AssertionError, match="plan changed"):
        test_seed_recipes.test_plan_json_matches_golden(NAME, update_golden=False)
