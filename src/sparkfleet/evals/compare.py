"""Pair two quality runs task by task: flips, exact McNemar p per block, one verdict line.

Blocks: primary = code + math + reasoning (what a lossy change breaks first), secondary = json +
format, guard = prose (degeneration only: any prose task that breaks trips it, whatever p says).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.errors import EvalError
from sparkfleet.evals.mcnemar import mcnemar_exact
from sparkfleet.evals.results import QualityRun, TaskResult

BLOCKS: dict[str, tuple[str, ...]] = {
    "primary": ("code", "math", "reasoning"),
    "secondary": ("json", "format"),
    "guard": ("prose",),
}
SIGNIFICANT = 0.05


@dataclass(frozen=True)
class Flip:
    """A task that passed in one run and failed in the other."""

    id: str
    category: str
    direction: str  # "broke" (A pass, B fail) or "fixed" (A fail, B pass)
    why: str  # the failing run's reason


@dataclass(frozen=True)
class BlockStats:
    """Paired counts and the exact McNemar p for one block."""

    name: str
    categories: tuple[str, ...]
    both_pass: int
    broke: int
    fixed: int
    both_fail: int
    p: float

    @property
    def n(self) -> int:
        return self.both_pass + self.broke + self.fixed + self.both_fail


@dataclass(frozen=True)
class Comparison:
    """The paired comparison of run A (baseline) and run B (candidate)."""

    a: str
    b: str
    paired: int
    only_in_a: tuple[str, ...]
    only_in_b: tuple[str, ...]
    blocks: tuple[BlockStats, ...]
    flips: tuple[Flip, ...]
    guard_tripped: bool
    verdict: str


def _block(name: str, cats: tuple[str, ...], pairs: list[tuple[TaskResult, TaskResult]]) -> BlockStats:
    rows = [(x, y) for x, y in pairs if x.category in cats]
    both_pass = sum(x.passed and y.passed for x, y in rows)
    broke = sum(x.passed and not y.passed for x, y in rows)
    fixed = sum(not x.passed and y.passed for x, y in rows)
    both_fail = sum(not x.passed and not y.passed for x, y in rows)
    return BlockStats(name, cats, both_pass, broke, fixed, both_fail, mcnemar_exact(broke, fixed))


def _verdict(blocks: dict[str, BlockStats], flips: list[Flip], guard: bool) -> str:
    if guard:
        broken = ", ".join(f.id for f in flips if f.category == "prose" and f.direction == "broke")
        return f"NOT NOISE: guard tripped — prose degenerated in B ({broken})"
    if not flips:
        return "no difference: every paired task has the same outcome (p = 1)"
    significant = [b for b in blocks.values() if b.p < SIGNIFICANT and b.name != "guard"]
    if significant:
        parts = []
        for b in significant:
            net = b.fixed - b.broke
            parts.append(f"{b.name} {'+' if net > 0 else ''}{net} (p = {b.p:.3g})")
        worse = any(b.fixed < b.broke for b in significant)
        return f"NOT NOISE: B is {'worse' if worse else 'better'} — " + "; ".join(parts)
    primary = blocks["primary"]
    net = primary.fixed - primary.broke
    return (
        f"noise: {len(flips)} flips, primary net {'+' if net > 0 else ''}{net} (p = {primary.p:.3g}); "
        "it takes about 5 net breaks with no gains to reach p < 0.07"
    )


def compare_runs(a: QualityRun, b: QualityRun) -> Comparison:
    """Pair the runs by task id; B is judged against A."""
    a_by = {r.id: r for r in a.results}
    b_by = {r.id: r for r in b.results}
    common = [tid for tid in a_by if tid in b_by]
    if not common:
        raise EvalError(f"runs {a.id} and {b.id} share no task ids; nothing to compare")
    pairs = [(a_by[t], b_by[t]) for t in common]
    flips = [
        Flip(x.id, x.category, "broke" if x.passed else "fixed", y.why if x.passed else x.why)
        for x, y in pairs
        if x.passed != y.passed
    ]
    blocks = {name: _block(name, cats, pairs) for name, cats in BLOCKS.items()}
    guard = blocks["guard"].broke > 0
    return Comparison(
        a=a.id,
        b=b.id,
        paired=len(pairs),
        only_in_a=tuple(t for t in a_by if t not in b_by),
        only_in_b=tuple(t for t in b_by if t not in a_by),
        blocks=tuple(blocks.values()),
        flips=tuple(flips),
        guard_tripped=guard,
        verdict=_verdict(blocks, flips, guard),
    )
