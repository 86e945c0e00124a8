"""Read captured real outputs: tests/fixtures/h200 (copies of ../shared/fixtures/h200) and this project's own."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "fixtures"
H200 = ROOT / "tests" / "fixtures" / "h200"
VM = ROOT / "tests" / "fixtures" / "vm-x86"


def h200_section(name: str, file: str = "node-facts-h200.txt") -> str:
    """The text under `## name` in one of the H200 capture files."""
    out: list[str] = []
    inside = False
    for line in (H200 / file).read_text().splitlines(keepends=True):
        if line.startswith("## "):
            inside = line[3:].strip() == name
            continue
        if inside:
            out.append(line)
    if not out and name not in (H200 / file).read_text():
        raise KeyError(name)
    return "".join(out)


def vm(name: str) -> str:
    """A file captured on the vm-x86 build machine."""
    return (VM / name).read_text()
