"""vLLM's Ray flow runs the ray and python3 of the environment vLLM comes from: a node's login
shell may put another python first on PATH (pyenv shims here: `import ray` then fails, and the
head waits for its Ray nodes forever)."""

from __future__ import annotations

from pathlib import Path

from sparkfleet.config.cluster import parse_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.plan.build import plan

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = {"name": "c", "defaults": {"gpus": "none", "rdma": False, "user": "root"},
           "nodes": [{"name": "n0", "host": "10.0.0.1"}, {"name": "n1", "host": "10.0.0.2"}]}  # fmt: skip


def test_the_ray_example_uses_the_venv_tools_on_every_rank() -> None:
    planned = plan(load_recipe(ROOT / "examples" / "gemma-vllm-ray-2node"), parse_cluster(CLUSTER, "c.toml"), "t")
    venv = "/root/.cache/sparkfleet/venv-vllm/bin"
    head, worker = planned.ranks[0].argv[-1], planned.ranks[1].argv[-1]
    assert f"{venv}/ray start --head --port=26379 --node-ip-address=10.0.0.1" in head
    assert f"until {venv}/python3 -c " in head
    assert f"exec {venv}/vllm serve sparkfleet/gemma3-270m" in head and "--distributed-executor-backend ray" in head
    assert worker.startswith(f"until {venv}/ray start --block --address=10.0.0.1:26379 --node-ip-address=10.0.0.2")


def test_an_image_entrypoint_keeps_the_names_on_path(tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text('engine = "vllm"\nmodel = "o/m"\nrequired_nodes = 2\n'
                                     'tensor_parallel_size = 2\ndistributed_backend = "ray"\n')  # fmt: skip
    planned = plan(load_recipe(tmp_path / "r.toml"), parse_cluster(CLUSTER, "c.toml"), "t")
    script = planned.ranks[0].argv[-1]
    assert script.startswith("ray start --head ") and " until python3 -c " in script
