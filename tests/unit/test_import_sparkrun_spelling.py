"""command_style = "sparkrun": an imported sparkrun recipe plans the command sparkrun runs, flag
for flag: the recipe's own spelling of the parallel sizes, host and port (``-tp 2``,
``--tp-size``, ``--pp-size``), their values set by the plan in place, nothing added that the
rendered command lacks, and --host/--port kept on a vLLM --headless rank as sparkrun keeps them.
A native recipe (command_style "sparkfleet") plans as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkfleet.config.cluster import parse_cluster
from sparkfleet.config.recipe import Recipe, load_recipe
from sparkfleet.errors import RecipeError
from sparkfleet.importers.sparkrun import import_sparkrun, read_sparkrun
from sparkfleet.plan.build import plan
from sparkfleet.plan.engines.base import set_in_place
from tests.conftest import ROOT

MODEL = "org/model"
REV = "0123456789abcdef0123456789abcdef01234567"


def _cluster(n: int, bind: str | None = None):  # type: ignore[no-untyped-def]
    nodes: list[dict[str, Any]] = [{"name": f"n{i}", "host": f"10.9.0.{i + 1}"} for i in range(n)]
    if bind is not None:
        for node in nodes:
            node["bind_address"] = bind
    return parse_cluster({"name": "t", "nodes": nodes}, "t")


def _import(tmp_path: Path, data: dict[str, Any]) -> Recipe:
    src = tmp_path / "r.yaml"
    src.write_text(yaml.safe_dump({"model": MODEL, "model_revision": REV, **data}))
    out = tmp_path / "r.toml"
    out.write_text(import_sparkrun(read_sparkrun(src), sparkrun_version="0.4.2").recipe_toml)
    return load_recipe(out)


def _argvs(recipe: Recipe, n: int, bind: str | None = None) -> list[tuple[str, ...]]:
    return [r.argv for r in plan(recipe, _cluster(n, bind), "d").ranks]


def _tail(argv: tuple[str, ...], start: str) -> tuple[str, ...]:
    """The argv from the first occurrence of start (skips the model path and revision)."""
    return argv[argv.index(start) :]


VLLM_2X = {
    "runtime": "vllm",
    "defaults": {"tensor_parallel": 2, "port": 8001, "served_model_name": "m"},
    "command": "vllm serve {model} -tp {tensor_parallel} --host 0.0.0.0 --port {port} "
    "--served-model-name {served_model_name}",
}


def test_vllm_keeps_the_recipes_spelling_on_every_rank_and_headless_keeps_host_and_port(tmp_path: Path) -> None:
    recipe = _import(tmp_path, VLLM_2X)
    assert recipe.command_style == "sparkrun" and recipe.tensor_parallel_size == 2 and recipe.port == 8001
    head, worker = _argvs(recipe, 2)
    rdv = ("--nnodes", "2", "--node-rank", "{}", "--master-addr", "10.9.0.1", "--master-port", "25000")
    own = ("-tp", "2", "--host", "0.0.0.0", "--port", "8001", "--served-model-name", "m")
    assert head[:2] == ("vllm", "serve")
    assert _tail(head, "-tp") == (*own, *(w.format(0) for w in rdv))
    # sparkrun passes the recipe's --host/--port to a --headless rank too (vLLM ignores them there).
    assert _tail(worker, "-tp") == (*own, *(w.format(1) for w in rdv), "--headless")
    for argv in (head, worker):
        assert "--tensor-parallel-size" not in argv and "--pipeline-parallel-size" not in argv and "-pp" not in argv


def test_vllm_tp_and_pp_values_follow_the_plan_in_place(tmp_path: Path) -> None:
    recipe = _import(tmp_path, {
        "runtime": "vllm", "defaults": {"tensor_parallel": 2, "pipeline_parallel": 2},
        "command": "vllm serve {model} --tensor-parallel-size={tensor_parallel} -pp {pipeline_parallel} --port 8000",
    })  # fmt: skip
    assert (recipe.tensor_parallel_size, recipe.pipeline_parallel_size, recipe.required_nodes) == (2, 2, 4)
    argvs = _argvs(recipe, 4)
    # The import reads --flag=value as the flag and its value (one option, two words).
    want = ("--tensor-parallel-size", "2", "-pp", "2", "--port", "8000")
    assert _tail(argvs[0], "--tensor-parallel-size")[:6] == want
    # A variant or --set that changes the sizes or port changes the recipe's own flags' values.
    bigger = recipe.model_copy(update={"tensor_parallel_size": 4, "required_nodes": 8, "port": 9000})
    argv = _argvs(bigger, 8)[3]
    assert _tail(argv, "--tensor-parallel-size")[:6] == ("--tensor-parallel-size", "4", "-pp", "2", "--port", "9000")
    assert argv.count("--port") == 1 and "--headless" in argv


def test_vllm_one_node_adds_no_flag_the_command_lacks(tmp_path: Path) -> None:
    recipe = _import(tmp_path, {"runtime": "vllm", "command": "vllm serve {model} --max-model-len 4096"})
    (argv,) = _argvs(recipe, 1)
    assert argv == ("vllm", "serve", MODEL, "--revision", REV, "--max-model-len", "4096", "--served-model-name", MODEL)
    # A site bind address the command does not name is added (the engine would listen everywhere).
    (argv,) = _argvs(recipe, 1, bind="10.9.0.1")
    assert _tail(argv, "--max-model-len")[2:] == ("--served-model-name", MODEL, "--host", "10.9.0.1")
    # One it names gets the site's value in place.
    named = _import(tmp_path, {"runtime": "vllm", "command": "vllm serve {model} --host 0.0.0.0 -tp 1"})
    (argv,) = _argvs(named, 1, bind="10.9.0.1")
    assert _tail(argv, "--host") == ("--host", "10.9.0.1", "-tp", "1", "--served-model-name", MODEL)


def test_vllm_ray_head_serves_with_the_recipes_flags(tmp_path: Path) -> None:
    recipe = _import(tmp_path, {
        "runtime": "vllm-ray", "defaults": {"tensor_parallel": 2},
        "command": "vllm serve {model} -tp {tensor_parallel} --port 8000",
    })  # fmt: skip
    assert recipe.distributed_backend == "ray"
    head, worker = _argvs(recipe, 2)
    serve = head[2].split(" exec ", 1)[1]
    assert "-tp 2 --port 8000" in serve and "--host" not in serve and "--tensor-parallel-size" not in serve
    assert "ray start --block" in worker[2]


def test_sglang_keeps_tp_size_pp_size_host_and_port(tmp_path: Path) -> None:
    recipe = _import(tmp_path, {
        "runtime": "sglang", "defaults": {"tensor_parallel": 1, "pipeline_parallel": 2},
        "command": "python3 -m sglang.launch_server --model-path {model} --tp-size {tensor_parallel} "
                   "--pp-size {pipeline_parallel} --host 0.0.0.0 --port 30001",
    })  # fmt: skip
    assert recipe.command_style == "sparkrun" and recipe.port == 30001
    head, worker = _argvs(recipe, 2)
    for rank, argv in enumerate((head, worker)):
        assert argv == (
            "python3", "-m", "sglang.launch_server", "--tp-size", "1", "--pp-size", "2", "--host", "0.0.0.0",
            "--port", "30001", "--model-path", MODEL, "--revision", REV,
            "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", "10.9.0.1:25000",
        )  # fmt: skip
        assert "--tp" not in argv


def test_sglang_one_node_without_size_flags(tmp_path: Path) -> None:
    recipe = _import(tmp_path, {"runtime": "sglang", "command": "sglang serve --model-path {model} --port 30000"})
    (argv,) = _argvs(recipe, 1)
    assert argv == ("sglang", "serve", "--port", "30000", "--model-path", MODEL, "--revision", REV)


def test_set_in_place_spellings() -> None:
    args = ("-tp", "2", "--x", "--tensor-parallel-size=2", "--tp")
    out, found = set_in_place(args, ("-tp", "--tensor-parallel-size", "--tp"), "4")
    assert found and out == ("-tp", "4", "--x", "--tensor-parallel-size=4", "--tp", "4")
    assert set_in_place(("--port", "1"), ("--host",), "h") == (("--port", "1"), False)


def test_native_recipes_plan_unchanged() -> None:
    """Seeds and native recipes keep command_style "sparkfleet": the adapter writes the sizes in
    its own spelling, --host/--port on rank 0 only (the golden plans hold the full argv)."""
    recipe = load_recipe(ROOT / "examples" / "gemma-vllm-2node" / "recipe.toml")
    assert recipe.command_style == "sparkfleet"
    head, worker = _argvs(recipe, recipe.required_nodes)
    for argv in (head, worker):
        at = argv.index("--tensor-parallel-size")
        assert argv[at : at + 4] == ("--tensor-parallel-size", "2", "--pipeline-parallel-size", "1")
    assert head[-4:] == ("--host", "0.0.0.0", "--port", str(recipe.port or 8000))
    assert worker[-1] == "--headless" and "--host" not in worker and "--port" not in worker


@pytest.mark.parametrize(("engine", "flag"), [("vllm", "-tp"), ("sglang", "--tp-size"), ("vllm", "--port")])
def test_a_native_recipe_setting_a_per_rank_flag_is_still_an_error(tmp_path: Path, engine: str, flag: str) -> None:
    path = tmp_path / "r.toml"
    path.write_text(f'engine = "{engine}"\nmodel = "/m"\nargs = ["{flag}", "2"]\n')
    with pytest.raises(RecipeError, match=f"args: {flag} is set by sparkfleet for each rank"):
        load_recipe(path)
    path.write_text(f'engine = "{engine}"\nmodel = "/m"\ncommand_style = "sparkrun"\nargs = ["{flag}", "2"]\n')
    assert load_recipe(path).args == (flag, "2")
    path.write_text(f'engine = "{engine}"\nmodel = "/m"\ncommand_style = "sparkrun"\nargs = ["--nnodes", "2"]\n')
    with pytest.raises(RecipeError, match="args: --nnodes is set by sparkfleet for each rank"):
        load_recipe(path)


def test_llama_cpp_in_sparkrun_style_keeps_only_rpc_for_itself(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text('engine = "llama-cpp"\nmodel = "/m.gguf"\ncommand_style = "sparkrun"\n'
                    'args = ["-m", "/m.gguf", "--port", "8000"]\n')  # fmt: skip
    assert load_recipe(path).args == ("-m", "/m.gguf", "--port", "8000")
    path.write_text('engine = "llama-cpp"\nmodel = "/m.gguf"\ncommand_style = "sparkrun"\nargs = ["--rpc", "h:1"]\n')
    with pytest.raises(RecipeError, match="args: --rpc is set by sparkfleet for each rank"):
        load_recipe(path)
    path.write_text('engine = "llama-cpp"\nmodel = "o/m-GGUF:Q4_K_M"\nmodel_file = "m.gguf"\nrevision = "r"\n'
                    'command_style = "sparkrun"\n')  # fmt: skip
    with pytest.raises(RecipeError, match="model: 'o/m-GGUF:Q4_K_M' is a repo:QUANT spec"):
        load_recipe(path)
