"""apply/ decides and nodes/ acts (docs/architecture.md): nothing under apply/, nor the memory
guard, runs a command on a transport or holds a command's words, and apply/ never names a
runtime class; it reaches nodes through functions of nodes/ and the Runtime protocol."""

from __future__ import annotations

import ast
from pathlib import Path

import sparkfleet

SRC = Path(sparkfleet.__file__).parent
DECIDING = [*sorted((SRC / "apply").rglob("*.py")), SRC / "evals" / "memguard.py"]
# The first word of every node command sparkfleet has written (a list starting with one is argv).
COMMANDS = {
    "sh",
    "bash",
    "cat",
    "test",
    "rm",
    "mkdir",
    "tar",
    "rsync",
    "sha256sum",
    "find",
    "stat",
    "exportfs",
    "docker",
    "ls",
    "tail",
    "sudo",
    "env",
    "kill",
    "nvidia-smi",
    "ssh",
    "python3",
    "head",
    "ln",
    "cp",
    "mv",
}
RUNTIME_CLASSES = {"DockerRuntime", "ProcessRuntime"}


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.name}:{getattr(node, 'lineno', 0)}"


def _findings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("run", "stream"):
            owner = node.func.value
            if not (isinstance(owner, ast.Name) and owner.id in ("asyncio", "subprocess")):
                found.append(f"{_where(path, node)} runs a command itself (.{node.func.attr})")
        if isinstance(node, ast.List) and node.elts:  # argv is a list of words
            first = node.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value in COMMANDS:
                found.append(f"{_where(path, node)} holds a command's words ({first.value!r} …)")
        if isinstance(node, ast.Name | ast.alias):
            name = node.id if isinstance(node, ast.Name) else node.name
            if name in RUNTIME_CLASSES and "evals" not in path.parts:
                found.append(f"{_where(path, node)} names {name}")
    return found


def test_apply_holds_no_node_command_and_names_no_runtime_class() -> None:
    assert [f for path in DECIDING for f in _findings(path)] == []


def test_the_check_finds_a_command_written_in_apply(tmp_path: Path) -> None:
    # The shapes the old apply/ had are found.
    sample = tmp_path / "sample.py"
    sample.write_text('from x import DockerRuntime\nt.run(["cat", p], check=False)\nargv = ["sh", "-c", "x"]\n')
    assert len(_findings(sample)) == 4, _findings(sample)
