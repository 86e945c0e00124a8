"""How many GPUs an exported job asks each node for: a GPU request on a CPU node is refused by the
scheduler (a local Slurm without gres rejects the whole sbatch), so it follows the cluster's
node, else the recipe."""

from __future__ import annotations

from pathlib import Path

from sparkfleet.config.cluster import parse_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.exporters.slurm import slurm_script

ROOT = Path(__file__).resolve().parents[2]


def _gpu_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH --gpus")]


def test_the_cpu_llamacpp_example_asks_for_no_gpu() -> None:
    assert _gpu_lines(slurm_script(load_recipe(ROOT / "examples" / "gemma-llamacpp-python"), "g")) == []


def test_a_llamacpp_recipe_that_offloads_asks_for_one(tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text('engine = "llama-cpp"\nmodel = "/m"\nmodel_file = "m.gguf"\n'
                                     'args = ["-ngl", "99"]\n')  # fmt: skip
    assert _gpu_lines(slurm_script(load_recipe(tmp_path / "r.toml"), "g")) == ["#SBATCH --gpus-per-node=1"]


def test_vllm_asks_for_its_ranks_per_node_unless_the_node_has_none() -> None:
    recipe = load_recipe(ROOT / "examples" / "gemma-vllm-2node")  # TP2 over two nodes
    assert _gpu_lines(slurm_script(recipe, "v")) == ["#SBATCH --gpus-per-node=1"]
    cpu = parse_cluster({"name": "c", "defaults": {"gpus": "none"}, "nodes": [{"name": "a", "host": "h"}]}, "c.toml")
    assert _gpu_lines(slurm_script(recipe, "v", like=cpu.nodes[0])) == []
    two = parse_cluster({"name": "c", "defaults": {"gpus": "0,1"}, "nodes": [{"name": "a", "host": "h"}]}, "c.toml")
    assert _gpu_lines(slurm_script(recipe, "v", like=two.nodes[0])) == ["#SBATCH --gpus-per-node=2"]
