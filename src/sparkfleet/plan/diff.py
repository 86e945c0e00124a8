"""What differs between two Plans of one recipe (``plan RECIPE --diff A B``), rank by rank:
the argv words, the env keys and the image. Pure; secret values are masked."""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass
from typing import Any

from sparkfleet.config.secrets import MASK
from sparkfleet.plan.model import Plan, RankPlan
from sparkfleet.plan.render import masked_argv


@dataclass(frozen=True)
class WordChange:
    """One run of changed argv words: ``a`` replaced by ``b`` at word ``at`` of A's argv
    (``a`` empty: inserted; ``b`` empty: deleted)."""

    at: int
    a: tuple[str, ...]
    b: tuple[str, ...]


@dataclass(frozen=True)
class RankDiff:
    """Everything that differs on one rank."""

    rank: int
    node: str
    argv: tuple[WordChange, ...]
    env_added: dict[str, str]
    env_removed: dict[str, str]
    env_changed: dict[str, tuple[str, str]]
    image: tuple[str | None, str | None] | None

    @property
    def same(self) -> bool:
        return not (self.argv or self.env_added or self.env_removed or self.env_changed or self.image)


def _env(rank: RankPlan) -> dict[str, str]:
    return {v.key: (MASK if v.secret else v.value) for v in rank.env}


def _rank_diff(a: RankPlan, b: RankPlan) -> RankDiff:
    wa, wb = tuple(masked_argv(a.argv, a) or ()), tuple(masked_argv(b.argv, b) or ())
    matcher = difflib.SequenceMatcher(a=wa, b=wb, autojunk=False)
    words = tuple(WordChange(i1, wa[i1:i2], wb[j1:j2]) for op, i1, i2, j1, j2 in matcher.get_opcodes() if op != "equal")
    ea, eb = _env(a), _env(b)
    return RankDiff(
        rank=a.rank,
        node=a.node.name,
        argv=words,
        env_added={k: eb[k] for k in sorted(eb.keys() - ea.keys())},
        env_removed={k: ea[k] for k in sorted(ea.keys() - eb.keys())},
        env_changed={k: (ea[k], eb[k]) for k in sorted(ea.keys() & eb.keys()) if ea[k] != eb[k]},
        image=(a.image, b.image) if a.image != b.image else None,
    )


def diff_plans(a: Plan, b: Plan) -> list[RankDiff]:
    """Per rank (in rank order), what B changes relative to A. Plans with different rank counts
    differ in ranks too: the extra ranks are compared with nothing."""
    out = [_rank_diff(ra, rb) for ra, rb in zip(a.ranks, b.ranks, strict=False)]
    for extra in (*a.ranks[len(b.ranks) :], *b.ranks[len(a.ranks) :]):
        in_a = extra in a.ranks
        out.append(RankDiff(
            rank=extra.rank, node=extra.node.name,
            argv=(WordChange(0, extra.argv if in_a else (), () if in_a else extra.argv),),
            env_added={} if in_a else _env(extra), env_removed=_env(extra) if in_a else {}, env_changed={},
            image=(extra.image, None) if in_a else (None, extra.image),
        ))  # fmt: skip
    return out


def diff_json(a: Plan, b: Plan) -> dict[str, Any]:
    """The ``plan --diff --json`` document."""
    return {
        "a": a.variant,
        "b": b.variant,
        "recipe": a.recipe_source,
        "ranks": [
            {
                "rank": d.rank,
                "node": d.node,
                "argv": [{"at": w.at, "a": list(w.a), "b": list(w.b)} for w in d.argv],
                "env": {
                    "added": d.env_added,
                    "removed": d.env_removed,
                    "changed": {k: {"a": va, "b": vb} for k, (va, vb) in d.env_changed.items()},
                },
                "image": {"a": d.image[0], "b": d.image[1]} if d.image else None,
            }
            for d in diff_plans(a, b)
        ],
    }


def diff_lines(a: Plan, b: Plan) -> list[str]:
    """The human view: per rank, ``-`` for A's words and keys, ``+`` for B's."""
    lines = [f"{a.recipe_source}: variant {a.variant} (-) → {b.variant} (+)"]
    diffs = diff_plans(a, b)
    if all(d.same for d in diffs):
        return [*lines, "no difference: every rank runs the same argv, env and image"]
    for d in diffs:
        if d.same:
            lines.append(f"rank {d.rank} on {d.node}: same")
            continue
        lines.append(f"rank {d.rank} on {d.node}:")
        if d.image:
            lines += [f"  - image {d.image[0] or '(host process)'}", f"  + image {d.image[1] or '(host process)'}"]
        for w in d.argv:
            lines.append(f"  argv word {w.at}:")
            if w.a:
                lines.append(f"  - {shlex.join(w.a)}")
            if w.b:
                lines.append(f"  + {shlex.join(w.b)}")
        for k, v in d.env_removed.items():
            lines.append(f"  - {k}={v}")
        for k, (va, vb) in d.env_changed.items():
            lines += [f"  - {k}={va}", f"  + {k}={vb}"]
        for k, v in d.env_added.items():
            lines.append(f"  + {k}={v}")
    return lines
