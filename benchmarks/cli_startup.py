"""Wall time of `sparkfleet --help` and of every subcommand's `--help` (Bar: median < 0.3 s each).

    python benchmarks/cli_startup.py [--runs 7]

Runs the installed console script as a user would (the virtualenv's, else `python -m`), --runs
times per command, and prints each command's median and worst wall time, with the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import typer.main
from typer.core import TyperGroup

from sparkfleet.cli.main import build_app

BAR_S = 0.3


def command_paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            found += command_paths(sub, (*path, name))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    exe = Path(sys.executable).with_name("sparkfleet")
    cmd = (
        [str(exe)]
        if exe.exists()
        else ([w] if (w := shutil.which("sparkfleet")) else [sys.executable, "-m", "sparkfleet.cli.main"])
    )
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    worst = ("", 0.0)
    for path in command_paths(typer.main.get_command(build_app())):
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run([*cmd, *path, "--help"], check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        name = " ".join(("sparkfleet", *path, "--help"))
        worst = max(worst, (name, median), key=lambda w: w[1])
        print(f"{name:40} median {median * 1000:4.0f} ms  max {max(times) * 1000:4.0f} ms")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    verdict = "PASS" if worst[1] < BAR_S else "FAIL"
    print(f"slowest: {worst[0]} {worst[1] * 1000:.0f} ms; bar: every median < {BAR_S * 1000:.0f} ms: {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
