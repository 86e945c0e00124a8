"""Wall time of `sparkfleet plan --json` on both seed recipes (Bar: under 0.5 s each).

Runs the installed console script as a user would, several times, and prints the median and
worst wall time per recipe.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ROOT / "tests" / "data" / "seeds"
CLUSTER = ROOT / "examples" / "clusters" / "spark4.toml"
RUNS = 7
BAR_S = 0.5


def main() -> int:
    exe = shutil.which("sparkfleet")
    cmd = [exe] if exe else [sys.executable, "-m", "sparkfleet.cli.main"]
    worst_median = 0.0
    for seed in sorted(SEEDS.iterdir()):
        times = []
        for _ in range(RUNS):
            start = time.perf_counter()
            subprocess.run([*cmd, "plan", str(seed), "--cluster", str(CLUSTER), "--json"],
                           check=True, stdout=subprocess.DEVNULL)  # fmt: skip
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        worst_median = max(worst_median, median)
        print(f"plan {seed.name}: median {median * 1000:.0f} ms, max {max(times) * 1000:.0f} ms over {RUNS} runs")
    verdict = "PASS" if worst_median < BAR_S else "FAIL"
    print(f"bar: median < {BAR_S * 1000:.0f} ms per recipe: {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
