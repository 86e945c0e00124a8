"""The needle heatmap PNG (matplotlib, imported by the CLI only when a PNG is asked for)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

from sparkfleet.errors import EvalError
from sparkfleet.evals.needle import NeedleRun

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap


def write_heatmap(run: NeedleRun, path: Path) -> Path:
    """Depth (rows) x length (columns), green pass / red fail / grey not run; returns the path."""
    grid = [
        [
            float("nan") if (c := run.cell(length, depth)) is None else (1.0 if c.passed else 0.0)
            for length in run.lengths
        ]
        for depth in run.depths
    ]
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(run.lengths), 1.0 + 0.5 * len(run.depths)))
    cmap = ListedColormap(["#d9534f", "#5cb85c"]).with_extremes(bad="#cccccc")
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(run.lengths)), [str(n) for n in run.lengths])
    ax.set_yticks(range(len(run.depths)), [f"{d:g}%" for d in run.depths])
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("needle depth")
    eff = run.effective_length
    ax.set_title(f"{run.model.split('/')[-1][:40]}: effective length {eff if eff else 'none'}", fontsize=9)
    for i, _depth in enumerate(run.depths):
        for j, _length in enumerate(run.lengths):
            value = grid[i][j]
            if value == value:  # not NaN
                ax.text(j, i, "pass" if value else "fail", ha="center", va="center", fontsize=8)
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise EvalError(f"cannot write heatmap {path}: {exc.strerror}") from exc
    finally:
        plt.close(fig)
    return path
