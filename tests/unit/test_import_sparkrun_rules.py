"""`import sparkrun` against sparkrun's own rules, on a corpus of public and hand-made recipes.

The expected flags below were worked out by hand from sparkrun's source (see
importers/sparkrun_rules.py for the files and commits): for a command-less recipe, walk the
runtime's flag map in order, write ``[flag, str(value)]`` for a valued key and the bare flag
for a truthy boolean key that is *also in the map*; drop every other key. They are not produced
by the importer and compared to itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sparkfleet.config.cluster import parse_cluster
from sparkfleet.config.recipe import Recipe, load_recipe
from sparkfleet.importers.sparkrun import import_sparkrun, read_sparkrun
from sparkfleet.plan.build import plan
from tests.cli_run import run_main
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data" / "import" / "sparkrun"
CORPUS = sorted(DATA.glob("*.yaml")) + sorted((DATA / "registry").glob("*.yaml"))


def _cluster(n: int):  # type: ignore[no-untyped-def]
    nodes = [{"name": f"n{i}", "host": f"10.9.0.{i + 1}"} for i in range(n)]
    return parse_cluster({"name": "t", "nodes": nodes}, "t")


def _imported(path: Path, tmp_path: Path, version: str | None = None) -> tuple[Recipe, object]:
    result = import_sparkrun(read_sparkrun(path), sparkrun_version=version)
    out = tmp_path / "recipe.toml"
    out.write_text(result.recipe_toml)
    return load_recipe(out), result


def _pairs(args: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """flag -> the words after it, for comparing flag sets without caring about their order."""
    out: dict[str, tuple[str, ...]] = {}
    current = None
    for word in args:
        if word.startswith("-"):
            current = word
            out[current] = ()
        else:
            assert current is not None, args
            out[current] += (word,)
    return out


def test_commandless_sglang_0_2_maps_every_key_sparkrun_maps_and_drops_the_rest(tmp_path: Path) -> None:
    recipe, result = _imported(DATA / "commandless-sglang-0.2.yaml", tmp_path, "0.2.40")
    # command_style "sparkrun": the size and port flags stay where sparkrun's builder writes them.
    assert recipe.command_style == "sparkrun"
    assert list(recipe.args) == [
        "--tp-size", "2", "--port", "30000",
        "--mem-fraction-static", "0.8", "--context-length", "65536", "--max-running-requests", "32",
        "--served-model-name", "qwen3-30b", "--dtype", "bfloat16", "--quantization", "fp8",
        "--trust-remote-code", "--chunked-prefill-size", "4096", "--kv-cache-dtype", "fp8_e5m2",
        "--tokenizer-path", "Qwen/Qwen3-30B-A3B",
    ]  # fmt: skip
    assert recipe.port == 30000 and recipe.tensor_parallel_size == 2
    # tensor_parallel: 2 with no min_nodes: sparkrun trims the hosts to tp x pp = 2 nodes.
    assert recipe.required_nodes == 2
    dropped = {n.key for n in result.not_carried if n.key.startswith("defaults.")}  # type: ignore[attr-defined]
    assert dropped == {"defaults.enable_torch_compile", "defaults.enable_decoder_swa_bounded_replay",
                       "defaults.reasoning_parser"}  # fmt: skip
    argv = plan(recipe, _cluster(2), "q").ranks[1].argv
    assert "--enable-decoder-swa-bounded-replay" not in argv and "--enable-torch-compile" not in argv


def test_commandless_sglang_0_4_uses_the_larger_map_and_sglang_serve(tmp_path: Path) -> None:
    recipe, result = _imported(DATA / "commandless-sglang-0.4.yaml", tmp_path)
    assert recipe.entrypoint == ("sglang", "serve")
    assert _pairs(recipe.args) == {
        "--tp-size": ("2",), "--port": ("8000",), "--host": ("0.0.0.0",),
        "--mem-fraction-static": ("0.81",), "--context-length": ("32768",), "--trust-remote-code": (),
        "--kv-cache-dtype": ("auto",), "--load-format": ("instanttensor",), "--reasoning-parser": ("minimax-m3",),
        "--tool-call-parser": ("minimax-m3",), "--cuda-graph-bs": ("1 2 4 8 12 16",), "--cuda-graph-max-bs": ("16",),
        "--fp4-gemm-backend": ("cutlass",), "--moe-runner-backend": ("triton",),
    }  # fmt: skip
    # disable_radix_cache: false is a boolean key: no flag. Unmapped keys: dropped, not flags.
    dropped = {n.key for n in result.not_carried if n.key.startswith("defaults.")}  # type: ignore[attr-defined]
    assert dropped == {"defaults.max_num_batched_tokens", "defaults.enable_decoder_swa_bounded_replay"}
    assert recipe.required_nodes == 2


def test_commandless_vllm_booleans_follow_the_map_and_revision_reaches_the_engine(tmp_path: Path) -> None:
    recipe, result = _imported(DATA / "commandless-vllm-0.2.yaml", tmp_path, "0.2.40")
    assert _pairs(recipe.args) == {
        "-tp": ("2",), "--port": ("8000",), "--host": ("0.0.0.0",),
        "--gpu-memory-utilization": ("0.85",), "--max-model-len": ("131072",),
        "--max-num-batched-tokens": ("8192",), "--max-num-seqs": ("16",), "--enable-prefix-caching": (),
        "--trust-remote-code": (), "--kv-cache-dtype": ("fp8",),
    }  # fmt: skip
    # enforce_eager: false -> nothing; enable_auto_tool_choice is in 0.2.40's boolean set but not
    # its flag map, so sparkrun never writes it.
    dropped = {n.key for n in result.not_carried if n.key.startswith("defaults.")}  # type: ignore[attr-defined]
    assert dropped == {"defaults.enable_auto_tool_choice", "defaults.tool_call_parser"}
    assert recipe.required_nodes == 2 and recipe.distributed_backend == "mp"
    for rank in plan(recipe, _cluster(2), "v").ranks:
        argv = list(rank.argv)
        assert argv[argv.index("--revision") + 1] == "0123456789abcdef0123456789abcdef01234567"


def test_env_templates_brace_escapes_and_volumes(tmp_path: Path) -> None:
    recipe, result = _imported(DATA / "dsv41-sglang-env-templates.yaml", tmp_path)
    sha = "fb2764a5cf321eaa5070ca8f9e892818f477c16d"
    assert recipe.env["TP_SIZE"] == "4"
    hub = "/cache/huggingface/hub/models--deepseek-ai--DeepSeek-V4.1-Flash"  # sparkrun's mount point
    assert recipe.env["DSV41_SOURCE"] == f"{hub}/snapshots/{sha}"
    assert recipe.env["NNODES"] == "4"
    # An escaped token stays literal, with one pair of braces; plain JSON is untouched.
    assert recipe.env["LITERAL_RANK"] == "{launch.node_rank}" and recipe.env["JSON_LITERAL"] == '{"a": 1}'
    args = list(recipe.args)
    word = args[args.index("--json-model-override-args") + 1]
    assert json.loads(word) == {"engram_table_dir": "/engram/v1"}
    mounts = [(m.host, m.container, m.read_only) for m in recipe.extra_mounts]
    assert mounts[:2] == [("/srv/engram", "/engram", True), ("/var/tmp/dsv41", "/state", False)]
    # min_sparkrun_version 0.4.0: sparkrun's runtime cache, a node folder at /cache/runtime.
    assert mounts[2][0].startswith("{{state}}/runtime-cache/sglang/") and mounts[2][1:] == ("/cache/runtime", False)
    assert recipe.env["XDG_CACHE_HOME"] == "/cache/runtime"
    assert recipe.shm_size == "32gb" and recipe.revision == sha
    ranks = plan(recipe, _cluster(4), "d").ranks
    for r in ranks:
        env = r.env_dict()
        assert env["DSV41_PACKED_DIR"] == f"/state/packed/{sha}/rank{r.rank}"
        argv = list(r.argv)
        assert argv[argv.index("--revision") + 1] == sha
        assert not any("{config." in v or "{launch.model" in v for v in env.values())
    assert {n.key for n in result.not_carried} >= {"executor_config.user"}  # type: ignore[attr-defined]


def test_registry_recipes_render_like_sparkrun(tmp_path: Path) -> None:
    sg, _ = _imported(DATA / "registry" / "minimax-m3-v0-nvfp4-2x-reap25.yaml", tmp_path)
    assert sg.entrypoint == ("sglang", "serve") and sg.required_nodes == 2 and sg.tensor_parallel_size == 2
    args = list(sg.args)
    # `--cuda-graph-bs {cuda_graph_bs}` renders unquoted: six shell words, as sparkrun's bash sees it.
    at = args.index("--cuda-graph-bs")
    assert args[at + 1 : at + 7] == ["1", "2", "4", "8", "12", "16"]
    assert args[args.index("--chunked-prefill-size") + 1] == "8192"
    assert sg.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"

    mtp, _ = _imported(DATA / "registry" / "qwen3.6-27b-fp8-mtp-vllm.yaml", tmp_path)
    args = list(mtp.args)
    assert json.loads(args[args.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 2}

    pp, result = _imported(DATA / "registry" / "qwen3.5-397b-a17b-int4-autoround-3x-vllm.yaml", tmp_path)
    assert (pp.required_nodes, pp.tensor_parallel_size, pp.pipeline_parallel_size) == (3, 1, 3)
    assert pp.env["VLLM_MARLIN_USE_ATOMIC_ADD"] == "1"
    notes = {n.key: n.detail for n in result.not_carried}  # type: ignore[attr-defined]
    assert notes["build_args"].startswith('= ["--tf5"]') and notes["max_nodes"].startswith("= 3")
    assert 'build_args: = ["--tf5"]' in result.recipe_toml  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_every_corpus_recipe_imports_validates_and_plans(path: Path, tmp_path: Path) -> None:
    recipe, result = _imported(path, tmp_path)
    if result.placeholders:  # type: ignore[attr-defined]
        return  # a GGUF repo:QUANT needs its file named first
    planned = plan(recipe, _cluster(recipe.required_nodes), "c")
    assert len(planned.ranks) == recipe.required_nodes
    for rank in planned.ranks:
        assert not any(w.startswith("{{") or "{config." in w for w in rank.argv)


BAD = {
    "unclosed-quote": "command: not a complete shell command line",
    "defaults-list": "defaults: must be a mapping, not a list",
    "min-nodes-word": "min_nodes: must be a whole number",
    "executor-list": "executor_config: must be a mapping",
    "volume-relative": "executor_config.volumes: 'relative:/x'",
    "env-config-missing": "env.X: {config.nope}",
    "env-launch-unknown": "env.X: {launch.nothing}: unknown launch field",
    "min-version-range": "min_sparkrun_version: must be a version string",
    "invalid-yaml": "invalid YAML at line 4",
    "not-a-mapping": "a sparkrun recipe is a YAML mapping",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_input_is_exit_2_and_one_line(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = DATA / "bad" / f"{name}.yaml"
    code, out, err = run_main(capsys, "import", "sparkrun", str(path))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and BAD[name] in lines[0], err
    assert "Traceback" not in err


EUGR = ROOT / "tests" / "data" / "import" / "eugr"


def test_eugr_recipe_and_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "recipe.toml"
    code, _, err = run_main(capsys, "import", "eugr", str(EUGR / "glm-4.7-nvfp4-2x.yaml"), "--out", str(out))
    assert code == 0, err
    recipe = load_recipe(out)
    # No model key: it is the command's `vllm serve` argument; cluster_only means two nodes at least.
    assert recipe.model == "Salyut1/GLM-4.7-NVFP4" and recipe.required_nodes == 2
    args = list(recipe.args)
    assert json.loads(args[args.index("--compilation-config") + 1]) == {"cudagraph_mode": "PIECEWISE"}
    assert "NOT UNDERSTOOD" not in err and 'build_args: = ["--pre-tf"]' in err
    cluster_file = tmp_path / "cluster.toml"
    code, _, err = run_main(capsys, "import", "eugr", str(EUGR / ".env"), "--out", str(cluster_file))
    assert code == 0, err
    from sparkfleet.config.cluster import load_cluster

    cluster = load_cluster(cluster_file)
    assert [n.fabric_ip for n in cluster.nodes] == ["192.168.177.11", "192.168.177.12"]
    assert cluster.nodes[1].fabric_ifname == "enp1s0f1np1" and cluster.nodes[0].ib_hca == "rocep1s0f1,roceP2p1s0f1"
    assert len(plan(recipe, cluster, "glm").ranks) == 2


@pytest.mark.parametrize("blank", [" ", "\t", "  \t "])
def test_a_blank_after_a_line_continuation_is_repaired_as_sparkrun_repairs_it(tmp_path: Path, blank: str) -> None:
    src = tmp_path / "r.yaml"
    command = f"vllm serve {{model}} \\\n  --enable-prefix-caching \\{blank}\n  --max-model-len 4096\n"
    src.write_text(yaml.safe_dump({"model": "org/m", "runtime": "vllm", "command": command}))
    args = import_sparkrun(read_sparkrun(src), sparkrun_version="0.4.2").recipe_toml
    recipe_path = tmp_path / "r.toml"
    recipe_path.write_text(args)
    assert load_recipe(recipe_path).args == (
        "--enable-prefix-caching", "--max-model-len", "4096", "--served-model-name", "org/m",
    )  # fmt: skip
