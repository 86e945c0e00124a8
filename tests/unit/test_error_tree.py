"""The error tree drawn in ``errors.py``'s docstring is the tree of its classes (httpx keeps its
``_exceptions.py`` drawing true the same way), and no other module grows a branch of its own."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import sparkfleet
from sparkfleet import errors

SRC = Path(sparkfleet.__file__).parent


def _drawn() -> dict[str, str | None]:
    """Each class named in the drawing, with the class drawn as its parent."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^(\s*(?:[│ ]\s*)*(?:[├└]── )?)([A-Z]\w+)(\s|$)", line)
        if match is None or not match.group(2).endswith(("Error", "Timeout", "Exited", "Incomplete")):
            continue
        depth = len(match.group(1))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[match.group(2)] = stack[-1][1] if stack else None
        stack.append((depth, match.group(2)))
    return parents


def _defined() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, cls in vars(errors).items():
        if inspect.isclass(cls) and issubclass(cls, errors.SparkfleetError) and cls.__module__ == errors.__name__:
            base = cls.__bases__[0]
            out[name] = base.__name__ if base is not Exception else None
    return out


def test_the_drawn_error_tree_is_the_tree_of_the_classes() -> None:
    drawn = _drawn()
    assert drawn["SparkfleetError"] is None and len(drawn) > 10  # the drawing was read
    assert drawn == _defined()


def test_no_module_outside_errors_defines_its_own_sparkfleet_error() -> None:
    roots = {name for name, cls in vars(errors).items() if inspect.isclass(cls) and issubclass(cls, Exception)}
    outside = []
    for path in SRC.rglob("*.py"):
        if path.name == "errors.py" and path.parent == SRC:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id in roots for b in node.bases):
                outside.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}")
    assert outside == []


def test_lifecycle_failures_raise_a_typed_error_not_the_bare_root() -> None:
    bare = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and isinstance(node.exc.func, ast.Name) and node.exc.func.id == "SparkfleetError"):  # fmt: skip
                bare.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert bare == []
