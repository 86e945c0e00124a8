"""Multi-node llama.cpp: rank 0 serves and drives the other nodes' rpc-server backends over --rpc.
RPC workers hold no tensor-parallel rank, so tensor_parallel_size does not limit required_nodes."""

from __future__ import annotations

import pytest

from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import parse_recipe
from sparkfleet.errors import PlanError
from sparkfleet.plan.build import check_plannable, plan
from tests.conftest import SPARK4


def _recipe(**extra: object) -> dict[str, object]:
    return {"engine": "llama-cpp", "model": "/models/g", "model_file": "g.gguf", "required_nodes": 3, **extra}


@pytest.mark.parametrize("docker", [False, True], ids=["process", "docker"])
def test_rank0_serves_with_rpc_peers_and_the_others_are_rpc_servers(docker: bool) -> None:
    data = _recipe(port=8080, rendezvous_port=50052, **({"docker_image": "llama:cuda"} if docker else {}))
    planned = plan(parse_recipe(data, "r.toml"), load_cluster(SPARK4), "g")
    head, *workers = planned.ranks
    assert len(planned.ranks) == 3 and planned.launch_order == (1, 2, 0)
    assert head.argv[:3] == ("llama-server", "--model", "/models/g/g.gguf")
    assert head.argv[head.argv.index("--rpc") + 1] == "192.168.200.12:50052,192.168.200.13:50052"
    # The native llama-server answers /health 503 while loading, 200 once it serves.
    assert (head.readiness.serves_http, head.readiness.health_path) == (True, "/health")
    for rank in workers:
        ip = rank.node.fabric_ip
        assert rank.argv == ("rpc-server", "--host", ip, "--port", "50052")
        # No HTTP on an RPC worker: ready once its port accepts a connection.
        assert not rank.readiness.serves_http and rank.readiness.tcp_port == 50052
        assert rank.ports == (50052,)
        if docker:
            assert rank.container_argv is not None and rank.container_argv[-4:] == ("--host", ip, "--port", "50052")


def test_workers_run_the_rpc_server_built_beside_a_llama_server_named_by_path() -> None:
    # scripts/setup-engines.sh builds both into one folder that is on no PATH.
    data = _recipe(entrypoint=["{{home}}/.cache/sparkfleet/llama.cpp/bin/llama-server"])
    head, *workers = plan(parse_recipe(data, "r.toml"), load_cluster(SPARK4), "g").ranks
    home = head.argv[0].removesuffix("/.cache/sparkfleet/llama.cpp/bin/llama-server")
    assert head.argv[0].endswith("/.cache/sparkfleet/llama.cpp/bin/llama-server")
    assert [w.argv[0] for w in workers] == [f"{home}/.cache/sparkfleet/llama.cpp/bin/rpc-server"] * 2


def test_tensor_parallel_size_does_not_limit_rpc_workers() -> None:
    recipe = parse_recipe(_recipe(required_nodes=4, tensor_parallel_size=1), "r.toml")
    check_plannable(recipe)
    assert len(plan(recipe, load_cluster(SPARK4), "g").ranks) == 4


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_gpu_engines_still_need_a_rank_on_every_node(engine: str) -> None:
    data = {"engine": engine, "model": "org/m", "required_nodes": 3, "tensor_parallel_size": 2}
    recipe = parse_recipe(data, "r.toml")
    with pytest.raises(PlanError, match=r"= 2 is smaller than required_nodes = 3: some nodes would hold no rank"):
        check_plannable(recipe)
    with pytest.raises(PlanError, match="some nodes would hold no rank"):
        plan(recipe, load_cluster(SPARK4), "m")
