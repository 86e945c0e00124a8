"""`import sparkrun`: the imported recipe plans the command sparkrun would run on each node.

The expected commands are built here from sparkrun's documented rules (sparkrun.md §3):
substitute ``{key}`` from defaults + model, then append the per-rank flags of its runtime.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from sparkfleet.config.cluster import parse_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.errors import RecipeError
from sparkfleet.importers.sparkrun import import_sparkrun, read_sparkrun, substitute
from sparkfleet.plan.build import plan
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data" / "import" / "sparkrun"
ALIASES = {"--tp-size": "--tp", "-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
           "--model": "--model-path"}  # fmt: skip


def _cluster(n: int):  # type: ignore[no-untyped-def]
    nodes = [{"name": f"n{i}", "host": f"10.9.0.{i + 1}"} for i in range(n)]
    return parse_cluster({"name": "t", "nodes": nodes}, "t")


def _sparkrun_argv(path: Path, rank: int, hosts: list[str]) -> list[str]:
    """What sparkrun runs on this rank for a recipe with a command template."""
    data = yaml.safe_load(path.read_text())
    text, _ = substitute(data["command"], {**(data.get("defaults") or {}), "model": data["model"]})
    argv = shlex.split(text.replace("\\\n", " "))
    n = len(hosts)
    if data["runtime"] == "sglang":
        argv += ["--dist-init-addr", f"{hosts[0]}:25000", "--nnodes", str(n), "--node-rank", str(rank)]
    elif data["runtime"] == "vllm" and n > 1:
        argv += [
            "--nnodes",
            str(n),
            "--node-rank",
            str(rank),
            "--master-addr",
            hosts[0],
            "--master-port",
            "25000",
        ]
        if rank > 0:
            argv.append("--headless")
    return argv


def _flags(
    argv: list[str] | tuple[str, ...],
) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]], list[str]]:
    """(program words, flag -> values, positional words) with sparkrun/sparkfleet aliases unified."""
    start = 3 if len(argv) > 2 and argv[1] == "-m" else (2 if argv[:2] in (["vllm", "serve"], ("vllm", "serve")) else 1)
    prog, flags, positional, current = tuple(argv[:start]), {}, [], None  # type: ignore[var-annotated]
    for word in argv[start:]:
        if word.startswith("-"):
            current = ALIASES.get(word, word)
            flags[current] = ()
        elif current is None:
            positional.append(word)
        else:
            flags[current] += (word,)
    return prog, flags, positional


def _imported(path: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    # The reference argv below models sparkrun 0.2.40's rendering (no served-name fill).
    result = import_sparkrun(read_sparkrun(path), sparkrun_version="0.2.40")
    out = tmp_path / "recipe.toml"
    out.write_text(result.recipe_toml)
    return load_recipe(out), result


@pytest.mark.parametrize("name", ["qwen3-sglang-2x", "llama70b-vllm-4x"])
def test_imported_recipe_plans_sparkruns_command_on_every_rank(name: str, tmp_path: Path) -> None:
    path = DATA / f"{name}.yaml"
    recipe, _ = _imported(path, tmp_path)
    n = recipe.required_nodes
    planned = plan(recipe, _cluster(n), name)
    hosts = [r.node.fabric_ip for r in planned.ranks]
    for r in range(n):
        prog, want, want_pos = _flags(_sparkrun_argv(path, r, hosts))
        got_prog, got, got_pos = _flags(planned.ranks[r].argv)
        assert got_prog == prog and got_pos == want_pos
        # command_style "sparkrun": the same flags exactly, --host/--port on a headless rank and
        # no parallel size the template leaves out included.
        assert got == want, (r, set(got.items()) ^ set(want.items()))


def test_json_flag_reaches_engine_as_one_word(tmp_path: Path) -> None:
    recipe, _ = _imported(DATA / "llama70b-vllm-4x.yaml", tmp_path)
    args = list(recipe.args)
    assert args[args.index("--compilation-config") + 1] == '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'
    assert recipe.shm_size == "16g" and recipe.docker_image == "vllm/vllm-openai:v0.11.0"
    assert recipe.env["NCCL_CUMEM_ENABLE"] == "0" and recipe.env["VLLM_USE_V1"] == "1"


def test_env_from_control_machine_and_secrets_are_listed_not_written(tmp_path: Path) -> None:
    recipe, result = _imported(DATA / "qwen3-sglang-2x.yaml", tmp_path)
    assert "HF_TOKEN" not in recipe.env and "$HF_TOKEN" not in result.recipe_toml.split("# sparkrun keys")[0]
    assert any(n.key == "env.HF_TOKEN" and "--env HF_TOKEN" in n.detail for n in result.not_carried)
    assert recipe.env["NCCL_DEBUG"] == "WARN"


def test_ray_runtime_keeps_ray_and_lists_unfilled_placeholder(tmp_path: Path) -> None:
    recipe, result = _imported(DATA / "qwen-vllm-ray-2x.yaml", tmp_path)
    assert recipe.distributed_backend == "ray" and recipe.rendezvous_port == 46379
    planned = plan(recipe, _cluster(2), "ray")
    head = planned.ranks[0].argv
    assert head[:2] == ("bash", "-c") and "--distributed-executor-backend ray" in head[2]
    assert "ray start --head --port=46379" in head[2]
    assert [n.key for n in result.not_understood] == ["{max_seqs}"]
    assert {"pre_exec", "benchmark"} <= {n.key for n in result.not_carried}


def test_gguf_repo_quant_is_kept_for_llama_cpp_to_fetch(tmp_path: Path) -> None:
    # sparkrun renders {model} as written: llama-server -hf repo:QUANT fetches the file at start.
    recipe, result = _imported(DATA / "gemma-llamacpp-1x.yaml", tmp_path)
    assert recipe.engine == "llama-cpp" and recipe.model == "ggml-org/gemma-3-270m-it-GGUF:Q4_K_M"
    assert recipe.model_file is None and recipe.revision is None and result.placeholders == ()
    assert recipe.command_style == "sparkrun"
    assert list(recipe.args) == ["-hf", "ggml-org/gemma-3-270m-it-GGUF:Q4_K_M", "--ctx-size", "4096",
                                 "--host", "0.0.0.0", "--port", "8080", "-ngl", "0"]  # fmt: skip
    assert recipe.port == 8080 and [n.key for n in result.not_understood] == ["cluster_tuning"]
    assert [item.split(":")[0] for item in recipe.not_carried] == ["model"]


def test_gguf_repo_quant_behind_dash_m_needs_the_pinned_file(tmp_path: Path) -> None:
    # -m repo:QUANT: sparkrun's launch downloads the GGUF and passes -m <its cache path>; the
    # import leaves that file and its revision to fill in.
    src = tmp_path / "m.yaml"
    src.write_text((DATA / "gemma-llamacpp-1x.yaml").read_text().replace("-hf {model}", "-m {model}"))
    recipe, result = _imported(src, tmp_path)
    assert recipe.model == "ggml-org/gemma-3-270m-it-GGUF"
    assert recipe.model_file is not None and recipe.model_file.startswith("<SET ME")
    assert recipe.revision is not None and recipe.revision.startswith("<SET ME")
    assert {n.key for n in result.placeholders} == {"model_file", "revision"}


def test_without_command_the_flag_map_builds_the_line(tmp_path: Path) -> None:
    recipe, result = _imported(DATA / "sglang-no-command.yaml", tmp_path)
    argv = plan(recipe, _cluster(1), "x").ranks[0].argv
    _, flags, _ = _flags(argv)
    # sparkrun 0.2.40 lists enable_torch_compile as a boolean but not in its flag map, and
    # build_flags_from_map walks the map: no --enable-torch-compile (nor any unmapped key).
    assert flags["--context-length"] == ("8192",) and "--enable-torch-compile" not in flags
    assert flags["--port"] == ("30001",) and flags["--tp"] == ("1",)
    assert {"defaults.warmup_steps", "defaults.enable_torch_compile"} <= {n.key for n in result.not_carried}


def test_bad_sparkrun_input_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(RecipeError, match=r"bad\.yaml: invalid YAML"):
        read_sparkrun(bad)
    bad.write_text("runtime: trtllm\nmodel: x/y\ncommand: trtllm-serve x/y\n")
    with pytest.raises(RecipeError, match="runtime: 'trtllm' has no sparkfleet engine"):
        import_sparkrun(read_sparkrun(bad))
    bad.write_text("runtime: sglang\n")
    with pytest.raises(RecipeError, match="model: required"):
        import_sparkrun(read_sparkrun(bad))
