"""PNG plots of a run: decode tok/s vs concurrency per prompt type, prefill tok/s vs length.

matplotlib is an optional extra (``pip install sparkfleet[plots]``) and heavy to import, so it is
imported only when a plot is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparkfleet.bench.report import TierSummary
from sparkfleet.bench.store import StoredRun
from sparkfleet.errors import BenchError


def _pyplot() -> Any:
    try:
        import matplotlib  # heavy optional dependency: imported only to draw

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise BenchError("plots need matplotlib: pip install 'sparkfleet[plots]'") from exc
    return plt


def _errbars(values: Sequence[TierSummary], attr: str) -> tuple[list[float], list[list[float]]]:
    meds, lo, hi = [], [], []
    for t in values:
        s = getattr(t, attr)
        meds.append(s.median or 0.0)
        lo.append((s.median or 0.0) - (s.low if s.low is not None else s.median or 0.0))
        hi.append((s.high if s.high is not None else s.median or 0.0) - (s.median or 0.0))
    return meds, [lo, hi]


def plot_run(run: StoredRun, tiers: Sequence[TierSummary], path: Path) -> Path:
    """Draw the run's figure into ``path`` (PNG) and return it."""
    plt = _pyplot()
    title = f"run {run.id}: {run.model} ({run.engine or '?'}) — {run.created_at}"
    if run.kind == "decode":
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
        for ptype in dict.fromkeys(t.prompt_type for t in tiers):
            rows = sorted((t for t in tiers if t.prompt_type == ptype), key=lambda t: t.concurrency or 0)
            xs = [t.concurrency for t in rows]
            meds, err = _errbars(rows, "headline")
            ax1.errorbar(xs, meds, yerr=err, marker="o", capsize=3, label=ptype)
            meds, err = _errbars(rows, "per_stream")
            ax2.errorbar(xs, meds, yerr=err, marker="o", capsize=3, label=ptype)
        for ax, what in ((ax1, "aggregate output tok/s (steady window)"), (ax2, "per-stream decode tok/s")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency")
            ax.set_ylabel(what)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend()
            ticks = sorted({t.concurrency or 1 for t in tiers})
            ax.set_xticks(ticks, [str(t) for t in ticks])
        ax1.set_title("aggregate; bars = min–max of runs")
        ax2.set_title("per stream (median)")
    else:
        fig, ax = plt.subplots(figsize=(8, 4.8))
        rows = sorted(tiers, key=lambda t: t.length or 0)
        meds, err = _errbars(rows, "headline")
        ax.errorbar([t.length for t in rows], meds, yerr=err, marker="o", capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("prefill tok/s (cold)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.set_xticks([t.length for t in rows], [f"{(t.length or 0) // 1024}k" for t in rows])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
