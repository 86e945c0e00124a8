"""`sparkfleet ab` over stand-in engines with a known decode speed (tests/standin_engine.py,
process runtime, this machine): a variant pair whose token interval differs 2× gets the faster
one named, an identical pair gets no difference, and nothing is left running either way."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from sparkfleet.state.history import History
from sparkfleet.state.store import Store
from tests.integration.conftest import leftover_processes, standin_recipe

RUN = str(os.getpid())
VARIANTS = """
[variants.slow]
args_set = ["--standin-itl", "0.012"]
[variants.fast]
args_set = ["--standin-itl", "0.006"]
[variants.fast-again]
extends = "fast"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ab(tmp_path: Path, name: str, pair: str) -> tuple[dict, subprocess.CompletedProcess[str]]:
    folder = standin_recipe(tmp_path / name, nodes=1, port=_free_port())
    (folder / "recipe.toml").write_text((folder / "recipe.toml").read_text() + VARIANTS)
    report = tmp_path / f"{name}.json"
    out = subprocess.run(
        [sys.executable, "-m", "sparkfleet.cli.main", "ab", str(folder), "--variants", pair, "--name", name,
         "--rounds", "2", "--output-len", "24", "--repeats", "3", "--out", str(report),
         "--out", str(tmp_path / "r.md")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "SPARKFLEET_STATE_DIR": str(tmp_path / "state")},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(report.read_text()), out


def _metric(report: dict, name: str) -> dict:
    return next(m for m in report["metrics"] if m["name"] == name)


def test_a_twice_as_fast_variant_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    name = f"test-ab-speed-{RUN}"
    report, out = _ab(tmp_path, name, "slow,fast")
    decode = _metric(report, "decode prose/c1 tok/s")
    assert decode["verdict"] == "fast", decode
    assert 80 < decode["diff_pct"] < 120  # 0.012 s → 0.006 s between tokens: twice the tok/s
    assert decode["interval_pct"][0] > 5
    assert report["order"] == [["slow", "fast"], ["fast", "slow"]]
    assert report["rounds"] == 2 and report["status"] == "complete"
    assert "**fast is better**" in out.stdout and "Rule:" in out.stdout
    # Every round's up is a configuration in the history (what `rollback` can go back to).
    configs = History(Store(tmp_path / "state" / "state.db")).of(name)
    assert sorted(c.variant for c in configs) == ["fast", "fast", "slow", "slow"] and all(c.ready for c in configs)
    assert leftover_processes(name) == []


def test_identical_variants_show_no_difference(tmp_path: Path) -> None:
    name = f"test-ab-same-{RUN}"
    report, _ = _ab(tmp_path, name, "fast,fast-again")
    assert [m["verdict"] for m in report["metrics"]] == [None] * len(report["metrics"]), report["metrics"]
    assert abs(_metric(report, "decode prose/c1 tok/s")["diff_pct"]) < 5
    assert leftover_processes(name) == []
