"""PNG plots of a run: decode tok/s vs concurrency per prompt type, prefill tok/s vs length, and
for an open-loop (serve) sweep the latency–throughput curve and goodput against the asked rate.

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
    if run.kind == "serve":
        fig = _serve_figure(plt, tiers)
    elif run.kind == "decode":
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


def _serve_figure(plt: Any, tiers: Sequence[TierSummary]) -> Any:
    """Left: TTFT and E2E percentiles against output tok/s, one point per rate tier (the
    latency–throughput curve). Right: achieved rate, completed req/s and goodput against the
    asked rate; ``inf`` is drawn one step right of the largest finite rate."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    rows = [t for t in tiers if t.figures]

    def med(t: TierSummary, key: str) -> float:
        value = t.figures[key].median
        return float("nan") if value is None else value

    xs = [med(t, "output_throughput") for t in rows]
    for key, label in (("ttft_p50", "TTFT p50"), ("ttft_p99", "TTFT p99"), ("e2el_p50", "E2E p50")):
        ax1.plot(xs, [med(t, key) for t in rows], marker="o", label=label)
    for t, x in zip(rows, xs, strict=True):
        ax1.annotate(t.tier + (" ⚠" if t.foreign_requests else ""), (x, med(t, "ttft_p50")),
                     textcoords="offset points", xytext=(4, 4), fontsize=8)  # fmt: skip
    ax1.set_xlabel("output tok/s")
    ax1.set_ylabel("latency, ms")
    ax1.set_yscale("log")
    ax1.set_title("latency against throughput, by asked rate")
    finite = [t.rate for t in rows if t.rate is not None and t.rate != float("inf")]
    inf_at = 2 * max(finite) if finite else 1.0
    rates = [inf_at if t.rate == float("inf") else (t.rate or 0.0) for t in rows]
    for key, label in (("achieved_rate", "achieved rate"), ("request_throughput", "completed req/s"),
                       ("goodput", "goodput (every SLO met)")):  # fmt: skip
        ax2.plot(rates, [med(t, key) for t in rows], marker="o", label=label)
    ax2.plot(finite, finite, "k:", alpha=0.4, label="asked")
    ax2.set_xticks(rates, [t.tier for t in rows])
    ax2.set_xlabel("asked request rate")
    ax2.set_ylabel("requests/s")
    ax2.set_ylim(bottom=0)
    ax2.set_title("goodput against rate")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend()
    return fig
