"""The A/B report: every metric with both variants' values, spread, % difference and verdict,
quality flips with McNemar's p, time to ready, the engine's own memory figures; JSON and Markdown."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparkfleet.experiments.store import Experiment, VariantRound
from sparkfleet.experiments.verdict import MIN_EFFECT, metric_verdict, quality_verdict, rule_text


def _side(rounds: Sequence[Sequence[float]]) -> dict[str, Any]:
    values = [v for r in rounds for v in r]
    means = [sum(r) / len(r) for r in rounds]
    return {"value": sum(values) / len(values), "min": min(values), "max": max(values),
            "rounds": [round(m, 4) for m in means]}  # fmt: skip


def build_report(experiment: Experiment, parts: Sequence[VariantRound],
                 min_effect: float = MIN_EFFECT) -> dict[str, Any]:  # fmt: skip
    """The report over every finished round (an interrupted experiment reports what it has)."""
    a, b = experiment.variants
    by = {v: [p for p in parts if p.variant == v] for v in (a, b)}
    done = sorted({p.round for p in parts if all(any(q.round == p.round for q in by[v]) for v in (a, b))})
    # Sorted by round, so the i-th values of A and B are the pair that ran back to back.
    by = {v: sorted((p for p in by[v] if p.round in done), key=lambda p: p.round) for v in (a, b)}
    order = [[p.variant for p in sorted((q for q in parts if q.round == r), key=lambda q: q.position)] for r in done]
    report: dict[str, Any] = {
        "experiment": experiment.id, "recipe": experiment.recipe, "deployment": experiment.name,
        "variants": {"a": a, "b": b}, "status": experiment.status, "rounds_planned": experiment.rounds,
        "rounds": len(done), "order": order, "rule": rule_text(min_effect), "metrics": [], "quality": None,
        "figures": {v: [p.figures for p in by[v]] for v in (a, b)},
        "bench_runs": {v: [r for p in by[v] for r in p.bench_runs] for v in (a, b)},
    }  # fmt: skip
    if not done:
        return report
    names = [m for m in by[a][0].metrics if all(m in p.metrics for p in by[a] + by[b])]
    sample = by[a][0]
    metrics = [("time to ready", "s", False, [[p.ready_s] for p in by[a]], [[p.ready_s] for p in by[b]])]
    metrics += [(m, sample.units.get(m, ""), sample.higher_is_better.get(m, True),
                 [p.metrics[m] for p in by[a]], [p.metrics[m] for p in by[b]]) for m in names]  # fmt: skip
    for name, unit, higher, ra, rb in metrics:
        v = metric_verdict(name, unit, higher, ra, rb, min_effect)
        better = {"a": a, "b": b}.get(v.better or "")
        report["metrics"].append({
            "name": name, "unit": unit, "better_is": "higher" if higher else "lower",
            "a": _side(v.a_rounds), "b": _side(v.b_rounds), "diff_pct": round(v.diff_pct, 2),
            "interval_pct": [round(100 * (x - 1), 2) for x in v.interval] if v.interval else None,
            "verdict": better,
            "verdict_text": f"{better} is better" if better else "no difference",
        })  # fmt: skip
    if all(p.quality is not None for p in by[a] + by[b]):
        q = quality_verdict([p.quality or {} for p in by[a]], [p.quality or {} for p in by[b]])
        better = {"a": a, "b": b}.get(q.better or "")
        report["quality"] = {
            "a_passed": q.a_passed, "b_passed": q.b_passed, "paired": q.paired, "broke": q.broke, "fixed": q.fixed,
            "mcnemar_p": q.p, "verdict": better, "verdict_text": f"{better} is better" if better else "no difference",
        }  # fmt: skip
    return report


def _num(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: one table of metrics, then quality, then how it was decided."""
    a, b = report["variants"]["a"], report["variants"]["b"]
    lines = [f"# A/B: {a} vs {b}", "",
             f"Recipe `{report['recipe']}`, deployment `{report['deployment']}`, experiment {report['experiment']}: "
             f"{report['rounds']} of {report['rounds_planned']} round(s) ({report['status']}); order "
             + ", ".join(" ".join(o) for o in report["order"]) + ".", ""]  # fmt: skip
    lines += [f"| metric | {a} (min–max) | {b} (min–max) | B vs A | 95% interval | verdict |",
              "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for m in report["metrics"]:
        interval = "—" if m["interval_pct"] is None else "{:+.1f}% … {:+.1f}%".format(*m["interval_pct"])
        lines.append(
            f"| {m['name']} ({m['unit']}, {m['better_is']} is better) | {_num(m['a']['value'])} "
            f"({_num(m['a']['min'])}–{_num(m['a']['max'])}) | {_num(m['b']['value'])} "
            f"({_num(m['b']['min'])}–{_num(m['b']['max'])}) | {m['diff_pct']:+.1f}% | {interval} "
            f"| **{m['verdict_text']}** |"
        )
    q = report.get("quality")
    if q:
        lines += ["", f"Quality: {a} {q['a_passed']}/{q['paired']}, {b} {q['b_passed']}/{q['paired']}; "
                  f"{q['broke']} broke, {q['fixed']} fixed; McNemar exact p = {q['mcnemar_p']:.3g}: "
                  f"**{q['verdict_text']}**."]  # fmt: skip
    figures = {v: [f for f in report["figures"][v] if f] for v in (a, b)}
    if any(figures.values()):
        lines += [
            "",
            "Engine figures (first round): "
            + "; ".join(
                f"{v}: " + ", ".join(f"{k} {_num(x)}" for k, x in fs[0].items()) for v, fs in figures.items() if fs
            ),
        ]
    lines += ["", f"Rule: {report['rule']}.", ""]
    return "\n".join(lines)
