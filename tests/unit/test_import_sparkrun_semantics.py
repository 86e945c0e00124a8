"""`import sparkrun` follows what sparkrun itself runs (issue 36): its container paths, its
common vs cluster-only env, SGLang solo launches, llama.cpp RPC, its command rendering per
version, and a recipe that cannot be carried whole is warned about (validate/plan) or refused
(--strict). Each recipe is written here; the expectations are sparkrun's behaviour as its source
states it (runtimes/_util.py default_env_hf_offline, primitives.build_volumes, base.get_extra_env,
sglang/vllm get_cluster_env, llama_cpp _DEFAULT_RPC_PORT, core/recipe.py render_command and
_resolve_vllm_variant, base.reconcile_flag_in_command), not the importer's output fed back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparkfleet.config.cluster import parse_cluster
from sparkfleet.config.recipe import Recipe, load_recipe
from sparkfleet.errors import RecipeError
from sparkfleet.importers.sparkrun import import_sparkrun, read_sparkrun
from sparkfleet.plan.build import plan
from tests.cli_run import run_main


def _cluster(n: int):  # type: ignore[no-untyped-def]
    nodes = [{"name": f"n{i}", "host": f"10.9.0.{i + 1}"} for i in range(n)]
    return parse_cluster({"name": "t", "defaults": {"hf_cache": "/srv/hf"}, "nodes": nodes}, "t")


def _write(tmp_path: Path, data: dict, name: str = "r.yaml") -> Path:  # type: ignore[type-arg]
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _import(tmp_path: Path, data: dict, version: str | None = None) -> Recipe:  # type: ignore[type-arg]
    result = import_sparkrun(read_sparkrun(_write(tmp_path, data)), sparkrun_version=version)
    out = tmp_path / "r.toml"
    out.write_text(result.recipe_toml)
    return load_recipe(out)


VLLM_SOLO = {"model": "org/m", "runtime": "vllm", "container": "img:1", "command": "vllm serve {model} --port 8000"}


def test_container_sees_the_hf_cache_where_sparkrun_mounts_it(tmp_path: Path) -> None:
    recipe = _import(tmp_path, VLLM_SOLO)
    assert recipe.hf_mount == "/cache/huggingface"
    rank = plan(recipe, _cluster(1), "d").ranks[0]
    assert ("/srv/hf", "/cache/huggingface", True) in [(m.host, m.container, m.read_only) for m in rank.mounts]
    env = rank.env_dict()
    # default_env_hf_offline + get_extra_env: both offline switches and HF_HOME at the mount.
    assert env["HF_HOME"] == "/cache/huggingface" and env["HF_HUB_OFFLINE"] == "1"
    assert env["TRANSFORMERS_OFFLINE"] == "1"


def test_a_recipe_without_hf_mount_keeps_the_engines_usual_path(tmp_path: Path) -> None:
    path = tmp_path / "plain.toml"
    path.write_text('engine = "vllm"\nmodel = "org/m"\ndocker_image = "img:1"\n')
    rank = plan(load_recipe(path), _cluster(1), "d").ranks[0]
    assert rank.env_dict()["HF_HOME"] == "/root/.cache/huggingface"


def test_recipe_hf_home_gives_way_to_sparkruns(tmp_path: Path) -> None:
    recipe = _import(tmp_path, {**VLLM_SOLO, "env": {"HF_HOME": "/root/.cache/huggingface", "A": "1"}})
    assert "HF_HOME" not in recipe.env and recipe.env["A"] == "1"
    assert plan(recipe, _cluster(1), "d").ranks[0].env_dict()["HF_HOME"] == "/cache/huggingface"


def test_no_container_runs_sparkruns_default_image(tmp_path: Path) -> None:
    recipe = _import(tmp_path, {k: v for k, v in VLLM_SOLO.items() if k != "container"})
    assert recipe.docker_image == "ghcr.io/spark-arena/dgx-vllm-eugr-nightly-tf5:latest"


SGLANG = {"model": "org/m", "runtime": "sglang", "container": "img:1",
          "command": "python3 -m sglang.launch_server --model-path {model} --port 30000"}  # fmt: skip


def test_one_node_sglang_has_no_rendezvous_flags_and_no_cluster_env(tmp_path: Path) -> None:
    recipe = _import(tmp_path, SGLANG)
    rank = plan(recipe, _cluster(1), "d").ranks[0]
    assert not {"--nnodes", "--node-rank", "--dist-init-addr"} & set(rank.argv)
    env = rank.env_dict()
    assert "NCCL_CUMEM_ENABLE" not in env and "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK" not in env


def test_two_node_sglang_gets_rendezvous_flags_and_cluster_env(tmp_path: Path) -> None:
    recipe = _import(tmp_path, {**SGLANG, "defaults": {"tensor_parallel": 2}})
    ranks = plan(recipe, _cluster(2), "d").ranks
    for r in ranks:
        argv = list(r.argv)
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(r.rank)
        assert argv[argv.index("--dist-init-addr") + 1] == "10.9.0.1:25000"
        env = r.env_dict()
        assert env["NCCL_CUMEM_ENABLE"] == "0" and env["SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"] == "0"


def test_vllm_cluster_env_and_0_4_drops_omp_threads(tmp_path: Path) -> None:
    data = {**VLLM_SOLO, "defaults": {"tensor_parallel": 2}}
    assert _import(tmp_path, data, "0.2.40").env["OMP_NUM_THREADS"] == "4"
    assert "OMP_NUM_THREADS" not in _import(tmp_path, data, "0.4.2").env
    assert "OMP_NUM_THREADS" not in _import(tmp_path, VLLM_SOLO).env  # one node: no cluster env


def test_llamacpp_rpc_on_sparkruns_port(tmp_path: Path) -> None:
    data = {"model": "/models/m.gguf", "runtime": "llama-cpp", "container": "img:1", "min_nodes": 2,
            "command": "llama-server -m {model} --port 8080"}  # fmt: skip
    recipe = _import(tmp_path, data)
    assert recipe.rendezvous_port == 50052
    head, worker = plan(recipe, _cluster(2), "d").ranks
    assert list(head.argv)[list(head.argv).index("--rpc") + 1] == "10.9.0.2:50052"
    assert worker.argv[0] == "rpc-server" and list(worker.argv)[list(worker.argv).index("--port") + 1] == "50052"


def test_rendering_before_0_4_is_vpds_and_0_4_collapses_escapes(tmp_path: Path) -> None:
    command = ("vllm serve {model} --compilation-config '{{\"mode\":3}}' "
               "--speculative-config '{\"model\":\"{draft}\"}' --port {port}")  # fmt: skip
    data = {**VLLM_SOLO, "command": command, "defaults": {"port": 8001, "draft": "org/d"}}
    old = list(_import(tmp_path, data, "0.3.0").args)
    # vpd: "{" to the next "}" is one key; {{...}} stays doubled and a key inside JSON is not reached.
    assert old[old.index("--compilation-config") + 1] == '{{"mode":3}}'
    assert old[old.index("--speculative-config") + 1] == '{"model":"{draft}"}'
    new = list(_import(tmp_path, data, "0.4.2").args)
    assert new[new.index("--compilation-config") + 1] == '{"mode":3}'
    assert new[new.index("--speculative-config") + 1] == '{"model":"org/d"}'


def test_served_model_name_is_appended_as_the_shell_splits_it(tmp_path: Path) -> None:
    data = {**VLLM_SOLO, "defaults": {"served_model_name": "a b"}}
    args = list(_import(tmp_path, data).args)
    assert args[args.index("--served-model-name") :][:3] == ["--served-model-name", "a", "b"]


def test_named_vllm_distributed_stays_native_with_a_ray_flag(tmp_path: Path) -> None:
    cmd = "vllm serve {model} --distributed-executor-backend ray"
    named = _import(tmp_path, {**VLLM_SOLO, "runtime": "vllm-distributed", "command": cmd})
    bare = _import(tmp_path, {**VLLM_SOLO, "command": cmd})
    assert named.distributed_backend == "mp" and bare.distributed_backend == "ray"


def test_a_shell_script_command_is_refused_by_name(tmp_path: Path) -> None:
    data = {**VLLM_SOLO, "command": "X=$(python3 -c 'print(1)') && exec vllm serve {model}"}
    with pytest.raises(RecipeError, match=r"r\.yaml: command: a shell script"):
        import_sparkrun(read_sparkrun(_write(tmp_path, data)))


def test_env_dollar_is_carried_literally_from_0_3(tmp_path: Path) -> None:
    data = {**VLLM_SOLO, "env": {"CACHE": "$HOME/x"}}
    assert "CACHE" not in _import(tmp_path, data, "0.2.40").env  # 0.2: expanded on the control machine
    assert _import(tmp_path, data, "0.3.0").env["CACHE"] == "$HOME/x"


def test_0_4_runtime_cache_is_mounted_at_cache_runtime(tmp_path: Path) -> None:
    recipe = _import(tmp_path, VLLM_SOLO, "0.4.2")
    rank = plan(recipe, _cluster(1), "d").ranks[0]
    mount = next(m for m in rank.mounts if m.container == "/cache/runtime")
    assert mount.host.startswith(rank.node.state_dir + "/runtime-cache/vllm/org__m-") and not mount.read_only
    env = rank.env_dict()
    assert env["XDG_CACHE_HOME"] == "/cache/runtime" and env["VLLM_CACHE_ROOT"] == "/cache/runtime/vllm"
    before = plan(_import(tmp_path, VLLM_SOLO, "0.3.0"), _cluster(1), "d").ranks[0]
    assert not any(m.container == "/cache/runtime" for m in before.mounts)


def test_sparkrun_version_must_be_a_version(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="--sparkrun-version"):
        import_sparkrun(read_sparkrun(_write(tmp_path, VLLM_SOLO)), sparkrun_version=">=0.4")


HOOKS = {**VLLM_SOLO, "mods": ["mods/fix"], "pre_exec": ["pip install x"], "metadata": {"a": 1}}


def test_what_changes_the_run_is_listed_in_not_carried(tmp_path: Path) -> None:
    recipe = _import(tmp_path, HOOKS)
    keys = [item.split(":")[0] for item in recipe.not_carried]
    assert sorted(keys) == ["mods", "pre_exec"]  # metadata changes nothing on the nodes
    assert plan(recipe, _cluster(1), "d").not_carried == recipe.not_carried


def test_validate_and_plan_warn_and_strict_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write(tmp_path, HOOKS)
    out = tmp_path / "r.toml"
    code, _, _ = run_main(capsys, "import", "sparkrun", str(src), "--out", str(out))
    assert code == 0
    code, _, err = run_main(capsys, "validate", str(out))
    assert code == 0 and "not carried over: pre_exec" in err and "not carried over: mods" in err
    code, _, err = run_main(capsys, "validate", str(out), "--strict")
    assert code == 2 and "--strict: not carried over by the import:" in err and "pre_exec" in err
    code, _, err = run_main(capsys, "plan", str(out), "--json")
    assert code == 0 and "not carried over: mods" in err
    code, _, err = run_main(capsys, "plan", str(out), "--strict")
    assert code == 2 and "pre_exec" in err


def test_import_flag_picks_the_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write(tmp_path, {**VLLM_SOLO, "command": None, "defaults": {"reasoning_parser": "qwen3"}})
    code, out, _ = run_main(capsys, "import", "sparkrun", str(src), "--sparkrun-version", "0.3.0")
    assert code == 0 and "--reasoning-parser" not in out  # 0.2/0.3 map has no such key
    code, out, _ = run_main(capsys, "import", "sparkrun", str(src), "--sparkrun-version", "0.4.2")
    assert code == 0 and '"--reasoning-parser", "qwen3"' in out
    # No min_sparkrun_version and no flag: the current release (0.4.2) runs it, with its rules.
    code, default, _ = run_main(capsys, "import", "sparkrun", str(src))
    assert code == 0 and default.replace("min_sparkrun_version: none", "--sparkrun-version 0.4.2") == out


# --- sparkrun 0.4.2 (the current release) ---------------------------------------------------------


def test_0_4_2_vllm_serves_under_the_recipe_model_when_no_name_is_given(tmp_path: Path) -> None:
    # _vllm_common._augment_vllm_served_model_name: fill, never override.
    args = list(_import(tmp_path, VLLM_SOLO, "0.4.2").args)
    assert args[args.index("--served-model-name") :][:2] == ["--served-model-name", "org/m"]
    assert "--served-model-name" not in _import(tmp_path, VLLM_SOLO, "0.4.0").args
    own = {**VLLM_SOLO, "command": "vllm serve {model} --served-model-name x"}
    assert list(_import(tmp_path, own, "0.4.2").args).count("--served-model-name") == 1
    commandless = {k: v for k, v in VLLM_SOLO.items() if k != "command"}
    args = list(_import(tmp_path, commandless, "0.4.2").args)
    assert args[args.index("--served-model-name") + 1] == "org/m"
    sglang = _import(tmp_path, {**SGLANG, "min_nodes": 1}, "0.4.2")
    assert "--served-model-name" not in sglang.args  # only the vLLM runtimes do this


def test_0_4_2_env_hf_hub_cache_torch_cache_and_spark_platform_defaults(tmp_path: Path) -> None:
    data = {**VLLM_SOLO, "env": {"HF_HUB_CACHE": "/elsewhere", "CUTE_DSL_ARCH": "sm_120"}}
    env = plan(_import(tmp_path, data, "0.4.2"), _cluster(1), "d").ranks[0].env_dict()
    # base.get_extra_env is merged over the recipe's env; the platform tier under it.
    assert env["HF_HUB_CACHE"] == "/cache/huggingface/hub"
    assert env["CUTE_DSL_ARCH"] == "sm_120" and env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["TORCH_HOME"] == "/cache/runtime/torch"
    assert env["TORCH_EXTENSIONS_DIR"] == "/cache/runtime/torch_extensions"
    old = plan(_import(tmp_path, VLLM_SOLO, "0.4.0"), _cluster(1), "d").ranks[0].env_dict()
    assert not {"HF_HUB_CACHE", "TORCH_HOME", "PYTORCH_CUDA_ALLOC_CONF"} & set(old)
