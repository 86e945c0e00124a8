"""Whether `switch` can bring NEW up beside OLD: another name, no shared port, and the memory plan
of both within a shared GPU node's memory (an unknown figure: not side by side)."""

from __future__ import annotations

from sparkfleet.apply.switch import side_by_side
from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import parse_recipe
from sparkfleet.plan.build import plan
from sparkfleet.plan.model import Overrides, Plan
from tests.conftest import SPARK4

GIB = 1 << 30


def _plan(name: str, port: int, weights_gib: int | None, fraction: str = "0.3", device: str | None = "120GiB") -> Plan:
    data: dict[str, object] = {
        "engine": "vllm", "model": "org/m", "port": port, "rendezvous_port": port + 1, "required_nodes": 1,
        "args": ["--gpu-memory-utilization", fraction],
        "memory": {"kv_bytes_per_token": 1024, "cuda_graph": "1GiB",
                   **({"device_memory": device} if device else {}),
                   **({"weights_per_rank": f"{weights_gib}GiB"} if weights_gib is not None else {})},
    }  # fmt: skip
    return plan(parse_recipe(data, "r.toml"), load_cluster(SPARK4), name, Overrides(name=name))


def test_another_name_and_port_with_room_for_both_goes_side_by_side() -> None:
    ok, why = side_by_side(_plan("old", 8000, 20), _plan("new", 8100, 20))
    assert ok, why


def test_the_same_name_or_a_shared_port_goes_one_after_the_other() -> None:
    assert side_by_side(_plan("same", 8000, 20), _plan("same", 8100, 20)) == (
        False, "both are named 'same': one record, one set of ports")  # fmt: skip
    ok, why = side_by_side(_plan("old", 8000, 20), _plan("new", 8000, 20))
    assert not ok and why.startswith("port 8000 on ")


def test_the_memory_plan_decides_where_both_would_not_fit() -> None:
    ok, why = side_by_side(_plan("old", 8000, 20, "0.6"), _plan("new", 8100, 20, "0.6"))
    assert not ok and "the memory plan needs" in why, why
    assert side_by_side(_plan("old", 8000, 20, "0.45"), _plan("new", 8100, 20, "0.45"))[0]
    ok, why = side_by_side(_plan("old", 8000, 20, device=None), _plan("new", 8100, 20, device=None))
    assert not ok and "figures unknown" in why, why
