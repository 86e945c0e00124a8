"""The quality task set: loading and validating the TOML files shipped in the package.

A task is data: an id, a category, a prompt, whether thinking is wanted, a token budget and a
``check`` table that the category's checker understands. The files live in
``sparkfleet/data/evals/tasks/*.toml`` (one ``[[task]]`` array per file); a user can point
``--tasks`` at a directory of their own files in the same format.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sparkfleet.errors import EvalError
from sparkfleet.evals.checks import CATEGORIES, validate_check

_REQUIRED = ("id", "category", "prompt", "check")
_ALLOWED = {*_REQUIRED, "thinking", "max_tokens"}


@dataclass(frozen=True)
class Task:
    """One auto-scored task."""

    id: str
    category: str
    prompt: str
    check: Mapping[str, Any] = field(hash=False)
    thinking: bool = False
    max_tokens: int = 256


def default_task_dir() -> Path:
    """Where the shipped task files are."""
    return Path(str(resources.files("sparkfleet") / "data" / "evals" / "tasks"))


def _task_from(raw: Mapping[str, Any], where: str) -> Task:
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise EvalError(f"{where}: missing key(s) {', '.join(missing)}")
    unknown = sorted(set(raw) - _ALLOWED)
    if unknown:
        raise EvalError(f"{where}: unknown key(s) {', '.join(unknown)}")
    category = raw["category"]
    if category not in CATEGORIES:
        raise EvalError(f"{where}: category {category!r} is not one of {', '.join(CATEGORIES)}")
    max_tokens = raw.get("max_tokens", 256)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise EvalError(f"{where}: max_tokens must be a positive integer")
    try:
        validate_check(category, raw["check"])
    except ValueError as exc:
        raise EvalError(f"{where}: check: {exc}") from exc
    return Task(
        id=str(raw["id"]),
        category=category,
        prompt=str(raw["prompt"]).strip(),
        check=dict(raw["check"]),
        thinking=bool(raw.get("thinking", False)),
        max_tokens=max_tokens,
    )


def load_task_file(path: Path) -> list[Task]:
    """The tasks of one TOML file; errors name the file and the task id or index."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise EvalError(f"{path}: {exc}") from exc
    entries = data.get("task", [])
    if not isinstance(entries, list):
        raise EvalError(f"{path}: 'task' must be an array of tables ([[task]])")
    out = []
    for i, raw in enumerate(entries):
        where = f"{path}: task {raw.get('id', f'#{i + 1}')}"
        out.append(_task_from(raw, where))
    return out


def load_tasks(
    directory: Path | None = None,
    *,
    categories: Iterable[str] | None = None,
    ids: Iterable[str] | None = None,
) -> list[Task]:
    """All tasks in the directory (the shipped set by default), filtered, in file then id order."""
    directory = directory or default_task_dir()
    files = sorted(directory.glob("*.toml"))
    if not files:
        raise EvalError(f"{directory}: no task files (*.toml)")
    tasks: list[Task] = []
    seen: dict[str, Path] = {}
    for path in files:
        for task in load_task_file(path):
            if task.id in seen:
                raise EvalError(f"{path}: task id {task.id!r} already defined in {seen[task.id]}")
            seen[task.id] = path
            tasks.append(task)
    if categories:
        wanted = set(categories)
        bad = wanted - set(CATEGORIES)
        if bad:
            raise EvalError(f"unknown categor(ies) {', '.join(sorted(bad))}; known: {', '.join(CATEGORIES)}")
        tasks = [t for t in tasks if t.category in wanted]
    if ids:
        wanted_ids = list(ids)
        unknown = [i for i in wanted_ids if i not in seen]
        if unknown:
            raise EvalError(f"unknown task id(s) {', '.join(unknown)}")
        tasks = [t for t in tasks if t.id in set(wanted_ids)]
    return tasks
