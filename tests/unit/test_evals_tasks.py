"""The shipped task set and task-file validation."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from sparkfleet.errors import EvalError
from sparkfleet.evals.checks import CATEGORIES, score
from sparkfleet.evals.tasks import load_tasks


def test_shipped_set_has_75_plus_tasks_in_all_six_categories() -> None:
    tasks = load_tasks()
    counts = Counter(t.category for t in tasks)
    assert len(tasks) >= 75
    assert set(counts) == set(CATEGORIES)
    assert len({t.id for t in tasks}) == len(tasks)
    assert all(t.thinking for t in tasks if t.category == "reasoning")
    assert all(t.max_tokens <= 512 for t in tasks)  # modest budgets keep a CPU run short


def test_filters_by_category_and_id() -> None:
    assert {t.category for t in load_tasks(categories=["json"])} == {"json"}
    assert [t.id for t in load_tasks(ids=["math_lcm"])] == ["math_lcm"]
    with pytest.raises(EvalError, match="unknown categor"):
        load_tasks(categories=["poetry"])
    with pytest.raises(EvalError, match="unknown task id"):
        load_tasks(ids=["nope"])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[task]]\nid = "a"\ncategory = "math"\nprompt = "p"\n', "missing key"),
        ('[[task]]\nid = "a"\ncategory = "poetry"\nprompt = "p"\ncheck.answer = 1\n', "category 'poetry'"),
        ('[[task]]\nid = "a"\ncategory = "math"\nprompt = "p"\ncheck.answr = 1\n', "needs 'answer'"),
        (
            '[[task]]\nid = "a"\ncategory = "math"\nprompt = "p"\ncheck.answer = 1\ncolour = 2\n',
            "unknown key",
        ),
        (
            '[[task]]\nid = "a"\ncategory = "code"\nprompt = "p"\ncheck.entry = "f"\ncheck.tests = "assert ("\n',
            "never closed",
        ),
        (
            '[[task]]\nid = "a"\ncategory = "format"\nprompt = "p"\ncheck.rules = [{rule = "haiku"}]\n',
            "must be one of",
        ),
        (
            '[[task]]\nid = "a"\ncategory = "json"\nprompt = "p"\ncheck.rules = [{path = "x", type = "float"}]\n',
            "type must be",
        ),
        ("[[task]\n", "task.toml"),
    ],
)
def test_bad_task_files_name_the_file_and_task(tmp_path: Path, body: str, message: str) -> None:
    (tmp_path / "task.toml").write_text(body)
    with pytest.raises(EvalError) as err:
        load_tasks(tmp_path)
    assert str(tmp_path / "task.toml") in str(err.value)
    assert message in str(err.value)


def test_duplicate_ids_across_files_are_refused(tmp_path: Path) -> None:
    task = '[[task]]\nid = "same"\ncategory = "math"\nprompt = "p"\ncheck.answer = 1\n'
    (tmp_path / "a.toml").write_text(task)
    (tmp_path / "b.toml").write_text(task)
    with pytest.raises(EvalError, match="already defined"):
        load_tasks(tmp_path)


def test_a_users_own_task_dir_is_scored() -> None:
    assert score("math", {"answer": 0.5, "tol": 0.001}, "one half = 0.5").passed
    assert not score("math", {"answer": 0.5, "tol": 0.001}, "0.51").passed
