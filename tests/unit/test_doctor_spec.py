"""What doctor checks for the seed recipes on the example 4-Spark cluster (pure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.doctor.run import spec_for
from sparkfleet.plan.build import plan

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / "tests" / "data" / "seeds"
SPARK4 = ROOT / "examples" / "clusters" / "spark4.toml"


def test_sglang_seed_needs_rdma_staging_space_ports_image_and_snapshot() -> None:
    cluster = load_cluster(SPARK4)
    spec = spec_for(cluster, plan(load_recipe(SEEDS / "dsv41-flash-4x-mia"), cluster, "mia"))
    assert [t.name for t in spec.nodes] == ["dgx1", "dgx2", "dgx3", "dgx4"]
    assert [t.head for t in spec.nodes] == [True, False, False, False]
    assert spec.image == "dsv41-4x-spark:mia-tp4" and spec.needs_docker
    assert spec.model_repo == "deepseek-ai/DeepSeek-V4.1-Flash"
    head, worker = spec.nodes[0], spec.nodes[1]
    assert head.rdma_required and head.ib_gid_index == 3 and head.fabric_ip == "192.168.200.11"
    assert head.staging == (("engram", "/home/kilork/mia-state/engram", 55 * 1024**3),)
    assert head.ports == (30000, 20000) and worker.ports == ()
    assert head.memlock == "unlimited" and head.hf_cache == "/mnt/nas/hf"


def test_vllm_seed_checks_the_composed_models_source_snapshot() -> None:
    cluster = load_cluster(SPARK4)
    spec = spec_for(cluster, plan(load_recipe(SEEDS / "dsv41-flash-eugr-0913-4x"), cluster, "eugr"))
    assert spec.model_repo == "deepseek-ai/DeepSeek-V4.1-Flash"
    assert spec.image == "eugr/spark-vllm-b12x:nightly-20260913"
    assert all(t.rdma for t in spec.nodes)


def test_without_a_recipe_only_the_nodes_are_checked() -> None:
    spec = spec_for(load_cluster(SPARK4))
    assert len(spec.nodes) == 4 and spec.image is None and spec.model_repo is None
    assert not any(t.staging or t.ports for t in spec.nodes)


def test_cli_names_a_missing_recipe_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sparkfleet.cli.main", "doctor", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "nope" in proc.stderr
