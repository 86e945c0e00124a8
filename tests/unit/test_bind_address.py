"""Where engine servers listen: 0.0.0.0 on a real fleet; each node's own address on a loopback
fleet, whose nodes share one host (two SGLang ranks on 0.0.0.0:PORT collide: rank 1's
placeholder health server takes the port and answers 200 for a head that never served)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfleet.config.cluster import parse_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.errors import ClusterError
from sparkfleet.plan.build import plan
from sparkfleet.plan.flags import flag_value

RECIPE = """engine = "{engine}"
model = "org/m"
port = 30000
required_nodes = 2
tensor_parallel_size = 2
"""


def _cluster(**defaults: object) -> dict[str, object]:
    return {"name": "c", "defaults": {"gpus": "none", "rdma": False, **defaults},
            "nodes": [{"name": "n0", "host": "127.0.0.10"}, {"name": "n1", "host": "127.0.0.11"}]}  # fmt: skip


@pytest.mark.parametrize("engine", ["sglang", "vllm", "llama-cpp"])
def test_a_real_fleet_listens_on_every_address(tmp_path: Path, engine: str) -> None:
    extra = 'model_file = "m.gguf"\nrevision = "abc"\n' if engine == "llama-cpp" else ""
    (tmp_path / "r.toml").write_text(RECIPE.format(engine=engine) + extra)
    planned = plan(load_recipe(tmp_path / "r.toml"), parse_cluster(_cluster(), "c.toml"), "t")
    assert flag_value(planned.head.argv, "--host") == "0.0.0.0"


def test_a_loopback_fleet_binds_each_sglang_rank_to_its_node(tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text(RECIPE.format(engine="sglang"))
    planned = plan(load_recipe(tmp_path / "r.toml"), parse_cluster(_cluster(bind_address="fabric"), "c.toml"), "t")
    assert [flag_value(r.argv, "--host") for r in planned.ranks] == ["127.0.0.10", "127.0.0.11"]
    assert [flag_value(r.argv, "--port") for r in planned.ranks] == ["30000", "30000"]
    assert planned.endpoint == "http://127.0.0.10:30000"  # where up probes health and smoke


def test_a_node_can_name_its_own_bind_address(tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text(RECIPE.format(engine="vllm"))
    data = _cluster()
    data["nodes"][0]["bind_address"] = "10.9.8.7"  # type: ignore[index]
    planned = plan(load_recipe(tmp_path / "r.toml"), parse_cluster(data, "c.toml"), "t")
    assert flag_value(planned.head.argv, "--host") == "10.9.8.7"


def test_a_bad_bind_address_is_one_line_naming_the_key() -> None:
    with pytest.raises(ClusterError) as err:
        parse_cluster(_cluster(bind_address="everywhere"), "c.toml")
    message = str(err.value)
    assert message.startswith("c.toml: ") and "bind_address" in message and "'everywhere'" in message
    assert "\n" not in message
