"""Both seed recipes load unchanged and plan as their comments say."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import deployment_name, load_recipe
from sparkfleet.plan.build import plan
from sparkfleet.plan.render import plan_json
from tests.conftest import ROOT, SEEDS, SHARED_SEEDS, SPARK4

MIA = SEEDS / "dsv41-flash-4x-mia"
EUGR = SEEDS / "dsv41-flash-eugr-0913-4x"


def _plan(path: Path) -> dict:
    return plan_json(plan(load_recipe(path), load_cluster(SPARK4), deployment_name(path)))


@pytest.mark.skipif(not SHARED_SEEDS.is_dir(), reason="../shared/seeds not beside this checkout")
@pytest.mark.parametrize("name", ["dsv41-flash-4x-mia", "dsv41-flash-eugr-0913-4x"])
def test_test_copies_are_the_seeds_unchanged(name: str) -> None:
    assert (SEEDS / name / "recipe.toml").read_bytes() == (SHARED_SEEDS / name / "recipe.toml").read_bytes()


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_sglang_seed_appends_per_rank_flags_and_keeps_env_mounts_staging() -> None:
    out = _plan(MIA)
    assert out["launch_order"] == [1, 2, 3, 0]
    for r in out["ranks"]:
        argv = r["argv"]
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        assert _flag(argv, "--nnodes") == "4"
        assert _flag(argv, "--node-rank") == str(r["rank"])
        assert _flag(argv, "--dist-init-addr") == "192.168.200.11:20000"
        assert _flag(argv, "--host") == "0.0.0.0"
        assert _flag(argv, "--port") == "30000"
        assert _flag(argv, "--tp") == "4"
        assert _flag(argv, "--model-path") == "deepseek-ai/DeepSeek-V4.1-Flash"
        assert argv.count("--node-rank") == 1
        assert r["env"]["DSV41_LAUNCHER"] == "tp4" and r["env_sources"]["DSV41_LAUNCHER"] == "recipe"
        assert r["env"]["SGLANG_HOST_IP"] == r["fabric_ip"]
        assert r["env_sources"]["SGLANG_HOST_IP"] == "cluster"
        # The recipe's own NIC pin wins over the cluster's (precedence: cluster < recipe).
        assert r["env_sources"]["NCCL_SOCKET_IFNAME"] == "recipe"
        assert {"host": "/home/kilork/mia-state", "container": "/state", "read_only": False} in r["mounts"]
        words = r["container_argv"]
        assert words[:3] == ["docker", "run", "-d"]
        assert "--env-file" in words and "--device" in words and "memlock=-1" in words
        assert words[words.index("--entrypoint") + 1] == "python3"
    engram = [s for s in out["staging"] if s["kind"] == "sparse-rows"]
    assert [(s["rank"], s["node"]) for s in engram] == [(0, "dgx1"), (1, "dgx2"), (2, "dgx3"), (3, "dgx4")]
    assert engram[0]["src"].startswith("/mnt/nas/hf/hub/models--deepseek-ai--DeepSeek-V4.1-Flash/")
    assert engram[0]["min_free"] == 55 * 1024**3


def test_vllm_seed_passes_json_flags_unquoted_and_headless_workers() -> None:
    out = _plan(EUGR)
    for r in out["ranks"]:
        argv = r["argv"]
        assert argv[:3] == ["vllm", "serve", "/model"]
        assert _flag(argv, "--compilation-config") == '{"cudagraph_mode":"FULL_AND_PIECEWISE"}'
        assert json.loads(_flag(argv, "--speculative-config"))["num_speculative_tokens"] == 7
        assert _flag(argv, "--nnodes") == "4"
        assert _flag(argv, "--node-rank") == str(r["rank"])
        assert _flag(argv, "--master-addr") == "192.168.200.11"
        assert _flag(argv, "--tensor-parallel-size") == "4"
        assert ("--headless" in argv) == (r["rank"] > 0)
        assert ("--port" in argv) == (r["rank"] == 0)
        assert r["env"]["VLLM_HOST_IP"] == r["fabric_ip"]
        assert r["env"]["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0"
        assert r["env_sources"]["NCCL_SOCKET_IFNAME"] == "cluster"
        assert r["env"]["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
        assert r["env"]["NCCL_IB_GID_INDEX"] == "3"
        assert any(m["container"] == "/model" and m["read_only"] for m in r["mounts"])
        # A shell would pass the same words: quoting once at the edge round-trips.
        assert shlex.split(shlex.join(r["container_argv"])) == r["container_argv"]
    composed = [s for s in out["staging"] if s["kind"] == "composed"]
    assert len(composed) == 4
    assert composed[0]["local_files"][1].endswith("model-00048-of-00048.safetensors")


@pytest.mark.parametrize("name", ["dsv41-flash-4x-mia", "dsv41-flash-eugr-0913-4x"])
def test_plan_json_matches_golden(name: str, update_golden: bool) -> None:
    out = _plan(SEEDS / name)
    out["recipe"] = f"tests/data/seeds/{name}/recipe.toml"
    text = json.dumps(out, indent=2) + "\n"
    golden = ROOT / "tests" / "golden" / f"{name}.plan.json"
    if update_golden:
        golden.write_text(text)
    elif not golden.is_file():  # a missing golden is a failure, never a silently new baseline
        pytest.fail(f"{golden.relative_to(ROOT)} is missing: review the plan, then rerun with --update-golden")
    assert text == golden.read_text(), "plan changed: review, then rerun with --update-golden"
    assert _plan(SEEDS / name) == _plan(SEEDS / name)


def test_secrets_are_masked_in_plan_json() -> None:
    from sparkfleet.plan.build import Overrides

    recipe = load_recipe(EUGR)
    out = plan_json(plan(recipe, load_cluster(SPARK4), "x", Overrides(env=(("HF_TOKEN", "hf_supersecretvalue"),))))
    text = json.dumps(out)
    assert "hf_supersecretvalue" not in text
    assert out["ranks"][0]["env"]["HF_TOKEN"] == "***"
    assert out["ranks"][0]["env_sources"]["HF_TOKEN"] == "cli"


SHARED_H200 = SHARED_SEEDS.parents[2] / "fixtures" / "h200"


@pytest.mark.skipif(not SHARED_H200.is_dir(), reason="../shared not beside this checkout")
def test_fixture_copies_are_the_shared_captures_unchanged() -> None:
    for capture in SHARED_H200.iterdir():
        assert (ROOT / "tests" / "fixtures" / "h200" / capture.name).read_bytes() == capture.read_bytes()
