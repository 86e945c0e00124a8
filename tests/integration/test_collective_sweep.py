"""`doctor --fabric --nccl RECIPE` on a 2-node namespace fleet (tests/fleet/netns.py: each node its
own network, real sshd, the fabric links shaped by `tc` to 200 Mbit/s): each rank of
examples/gemma-vllm-2node runs the sweep in its engine's own Python (the vLLM CPU venv's torch)
over gloo (no GPU here), with the planned environment (GLOO_SOCKET_IFNAME set to the fabric NIC
by --env, as a user does for this fleet). The table comes out, the bus bandwidth is bounded by the
shaped link (the collective really crossed the fabric), and nothing is left on either node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkfleet.config import caches
from tests.fleet.netns import NetnsFleet, shaped_fleet, usable

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = caches.engine_cache() / "venv-vllm" / "bin" / "python"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not VLLM_PY.exists(), reason="the vLLM CPU venv (torch): scripts/setup-engines.sh vllm"),
    pytest.mark.skipif(usable() is not None, reason=f"netns fleet: {usable()}"),
]
LINK_MBIT = 200.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsFleet]:
    with shaped_fleet(2, tmp_path_factory.mktemp("collective"), LINK_MBIT, odd=None, name="collective") as f:
        yield f


def _doctor(fleet: NetnsFleet, *extra: str, state: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "sparkfleet.cli.main", "doctor", str(ROOT / "examples" / "gemma-vllm-2node"),
            "--cluster", str(fleet.cluster_file), "--fabric", "--nccl", "--nccl-max-mib", "4",
            "--fabric-seconds", "1", "--env", "GLOO_SOCKET_IFNAME=enp1s0f0np0", *extra]  # fmt: skip
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "SPARKFLEET_STATE_DIR": str(state)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)


def _left_on(fleet: NetnsFleet) -> list[str]:
    """Python processes still running in either node's namespace (the sweep's ranks)."""
    return [name for i in range(2) for name in fleet.processes(i) if name.startswith("python")]


def test_the_sweep_runs_on_both_ranks_and_prints_the_table(fleet: NetnsFleet, tmp_path: Path) -> None:
    proc = _doctor(fleet, state=tmp_path / "state")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "collective sweep: 2 ranks (gloo on cpu)" in out, out
    words = [line.split() for line in out.splitlines()]
    sizes = [" ".join(w[:2]) for w in words if len(w) == 8 and w[1] in ("KiB", "MiB")]
    assert sizes == ["1 KiB", "4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB", "4 MiB"], out
    assert "PASS fabric.collective" in out and "all-reduce bus bandwidth" in out
    # Set beside the pair test of the same run.
    assert "× the slowest fabric pair's" in out and "(doctor --fabric, this run)" in out
    assert "PASS fabric.bandwidth" in out
    assert _left_on(fleet) == []


def test_json_has_real_rows_that_grow_with_size(fleet: NetnsFleet, tmp_path: Path) -> None:
    proc = _doctor(fleet, "--json", state=tmp_path / "state")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    both = json.loads(proc.stdout)
    report = both["collective"]
    assert [(r["rank"], r["backend"], r["device"], r["error"]) for r in report["ranks"]] == [
        (0, "gloo", "cpu", None), (1, "gloo", "cpu", None)]  # fmt: skip
    rows = {(r["op"], r["bytes"]): r for r in report["rows"]}
    assert len(rows) == 14
    for op in ("all_reduce", "all_gather"):
        small, large = rows[(op, 1024)], rows[(op, 4 << 20)]
        # A 4 MiB collective moves 4096 times the bytes of a 1 KiB one: it takes longer, at a higher rate.
        assert large["time_us"] > small["time_us"] and large["algbw_gbps"] > small["algbw_gbps"]
        for r in (small, large):
            factor = 1.0 if op == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n at n = 2
            assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)
            assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] / 1e6) / 1e9)
    # The ranks talked over the shaped fabric: all-reduce's bus bandwidth at 4 MiB is what one link
    # carries, so it cannot pass the link's 200 Mbit/s (+15 % for the token bucket's burst), and the
    # report sets it beside the pair test's figure for the same link.
    bus_mbit = rows[("all_reduce", 4 << 20)]["busbw_gbps"] * 8000
    assert 0.2 * LINK_MBIT < bus_mbit <= 1.15 * LINK_MBIT, bus_mbit
    assert report["link_gbits"] == pytest.approx(min(
        r for p in both["fabric"]["pairs"] for r in (p["forward_mbps"], p["reverse_mbps"])) / 1000)  # fmt: skip


def test_a_python_without_torch_is_named(fleet: NetnsFleet, tmp_path: Path) -> None:
    proc = _doctor(fleet, "--nccl-python", "/usr/bin/python3", state=tmp_path / "state")
    assert proc.returncode == 1
    assert "FAIL fabric.collective" in proc.stdout and "No module named 'torch'" in proc.stdout, proc.stdout
    assert _left_on(fleet) == []


def test_nccl_needs_a_recipe(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", "doctor", "--fabric", "--nccl"],
                          capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})  # fmt: skip
    assert proc.returncode == 2 and "--nccl runs on a recipe's ranks" in proc.stderr, proc.stderr
