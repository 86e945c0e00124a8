"""plan warns (and --strict refuses) where a recipe [env] value replaces a cluster value that
differs between nodes: seed 001 on a fleet whose second node names its fabric NIC otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.plan.build import plan
from sparkfleet.plan.model import Overrides
from tests.cli_run import run_main

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "tests/data/seeds/dsv41-flash-4x-mia"
SPARK4 = ROOT / "examples/clusters/spark4.toml"


def _mixed_cluster(tmp_path: Path) -> Path:
    """spark4 with dgx2's fabric NIC on the other ConnectX port (enp1s0f1np1)."""
    text = SPARK4.read_text().replace(
        'fabric_ip = "192.168.200.12"\n', 'fabric_ip = "192.168.200.12"\nfabric_ifname = "enp1s0f1np1"\n'
    )
    assert "enp1s0f1np1" in text
    path = tmp_path / "spark4-mixed.toml"
    path.write_text(text)
    return path


def test_seed_on_a_mixed_fleet_plans_with_a_warning_naming_node_key_and_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(capsys, "plan", str(SEED), "--cluster", str(_mixed_cluster(tmp_path)))
    assert code == 0, err
    lines = [line for line in err.splitlines() if "NCCL_SOCKET_IFNAME" in line]
    assert len(lines) == 1
    line = lines[0]
    assert "node dgx2" in line and "NCCL_SOCKET_IFNAME=enp1s0f0np0" in line and "enp1s0f1np1" in line
    assert "dgx1" in line  # the per-node values are listed, so the user sees who differs
    assert any("GLOO_SOCKET_IFNAME" in x and "node dgx2" in x for x in err.splitlines())
    assert "dgx2" in out  # the plan itself still prints


def test_strict_refuses_with_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "plan", str(SEED), "--cluster", str(_mixed_cluster(tmp_path)), "--strict")
    assert code == 2 and out == ""
    assert err.startswith("error:") and "--strict" in err and "node dgx2" in err and "Traceback" not in err


def test_uniform_cluster_values_overridden_by_the_recipe_are_not_warned(capsys: pytest.CaptureFixture[str]) -> None:
    # spark4 sets the same NIC on every node: the recipe's value is a deliberate choice, no surprise.
    code, _, err = run_main(capsys, "plan", str(SEED), "--cluster", str(SPARK4), "--strict")
    assert code == 0 and "warning" not in err


def test_json_output_stays_parseable_and_the_plan_carries_the_overrides(tmp_path: Path) -> None:
    cluster = load_cluster(_mixed_cluster(tmp_path))
    p = plan(load_recipe(SEED), cluster, "mia")
    assert {(w.node, w.key, w.value, w.cluster_value) for w in p.warnings} == {
        ("dgx2", "NCCL_SOCKET_IFNAME", "enp1s0f0np0", "enp1s0f1np1"),
        ("dgx2", "GLOO_SOCKET_IFNAME", "enp1s0f0np0", "enp1s0f1np1"),
    }
    # --env on the command line is the same hazard, named as such
    p2 = plan(load_recipe(SEED), cluster, "mia", Overrides(env=(("NCCL_SOCKET_IFNAME", "eth9"),)))
    cli = [w for w in p2.warnings if w.key == "NCCL_SOCKET_IFNAME"]
    assert [w.node for w in cli] == ["dgx1", "dgx2", "dgx3", "dgx4"] and {w.source for w in cli} == {"cli"}
    assert "--env NCCL_SOCKET_IFNAME=eth9" in cli[1].message
    rank = next(r for r in p.ranks if r.node.name == "dgx2")
    assert {v.key: v.source for v in rank.env}["NCCL_SOCKET_IFNAME"] == "recipe"
