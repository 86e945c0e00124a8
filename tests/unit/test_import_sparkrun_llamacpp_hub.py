"""An imported llama.cpp recipe whose model is ``repo:QUANT`` runs as sparkrun runs it (issue 36).

sparkrun 0.4.2 (runtimes/llama_cpp.py generate_command, _build_rpc_head_command,
_build_rpc_worker_command; core/launcher.py "GGUF model resolution") renders the recipe's command
with ``{model}`` = the spec as written, so llama-server gets ``-hf repo:QUANT`` and downloads the
GGUF itself (its dry run; a real run that finds the file in the cache first passes ``-m <path>``).
On more than one node the head runs the command built from the defaults, not the recipe's command,
plus ``--rpc worker:50052``; workers run ``rpc-server --port 50052``. The recipes here are shaped
like the third-party ones (aceangel3k/sparkrun-recipes); the expectations are sparkrun's output.
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

SPEC = "unsloth/gpt-oss-20b-GGUF:Q4_K_M"
SOLO = {
    "model": SPEC,
    "runtime": "llama-cpp",
    "max_nodes": 1,
    "container": "scitrera/dgx-spark-llama-cpp:b8094-cu131",
    "defaults": {"port": 8000, "host": "0.0.0.0", "n_gpu_layers": 999, "ctx_size": 262144, "threads": 20},
    "command": "llama-server \\\n  -hf {model} \\\n  --host {host} \\\n  --port {port} \\\n"
    "  --ctx-size {ctx_size} \\\n  --n-gpu-layers {n_gpu_layers} \\\n  -t {threads} \\\n  --jinja\n",
}
RPC = {
    "model": "unsloth/Qwen3.5-397B-A17B-GGUF:Q3_K_M",
    "runtime": "llama-cpp",
    "min_nodes": 2,
    "container": "scitrera/dgx-spark-llama-cpp:b8094-cu131",
    "defaults": {"port": 8000, "host": "0.0.0.0", "n_gpu_layers": 99, "ctx_size": 262144, "split_mode": "layer"},
    "command": "llama-server -hf {model} --host {host} --port {port} --n-gpu-layers {n_gpu_layers} "
    "--ctx-size {ctx_size} --flash-attn on --jinja --split-mode {split_mode} --no-webui --no-mmap",
}
TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123456789"


def _cluster(n: int):  # type: ignore[no-untyped-def]
    nodes = [{"name": f"n{i}", "host": f"10.9.0.{i + 1}"} for i in range(n)]
    return parse_cluster({"name": "t", "defaults": {"hf_cache": "/srv/hf"}, "nodes": nodes}, "t")


def _line(text: str) -> str:
    return " ".join(text.split())


def _write(tmp_path: Path, data: dict, name: str = "r.yaml") -> Path:  # type: ignore[type-arg]
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _import(tmp_path: Path, data: dict, env: str = "") -> Recipe:  # type: ignore[type-arg]
    result = import_sparkrun(read_sparkrun(_write(tmp_path, data)))
    out = tmp_path / "r.toml"
    out.write_text(result.recipe_toml.replace("\n[env]\n", f"\n[env]\n{env}", 1))
    return load_recipe(out)


def test_one_node_plans_hf_repo_quant_as_sparkrun_renders_it(tmp_path: Path) -> None:
    recipe = _import(tmp_path, SOLO)
    assert recipe.model == SPEC and recipe.model_file is None and recipe.revision is None
    assert recipe.command_style == "sparkrun"
    planned = plan(recipe, _cluster(1), "d")
    (rank,) = planned.ranks
    # sparkrun: the rendered command as written, nothing appended (no --alias: no served_model_name).
    assert list(rank.argv) == ["llama-server", "-hf", SPEC, "--host", "0.0.0.0", "--port", "8000",
                               "--ctx-size", "262144", "--n-gpu-layers", "999", "-t", "20", "--jinja"]  # fmt: skip
    # Nothing is staged for it: llama.cpp fetches the file at start, into the mounted cache.
    assert planned.staging == () and planned.model_repo is None
    env = rank.env_dict()
    assert "HF_HUB_OFFLINE" not in env and "TRANSFORMERS_OFFLINE" not in env
    assert env["HF_HOME"] == "/cache/huggingface" and env["HF_HUB_CACHE"] == "/cache/huggingface/hub"
    assert env["XDG_CACHE_HOME"] == "/cache/runtime"
    mounts = {m.container: (m.host, m.read_only) for m in rank.mounts}
    assert mounts["/cache/huggingface"] == ("/srv/hf", False)  # llama.cpp writes the download there
    assert "/cache/runtime" in mounts


def test_the_warning_names_model_and_no_placeholder_is_left(tmp_path: Path) -> None:
    result = import_sparkrun(read_sparkrun(_write(tmp_path, SOLO)))
    assert result.placeholders == ()
    (note,) = [n for n in result.not_carried if n.key == "model"]
    assert note.detail.startswith(f"llama.cpp downloads {SPEC} on each node at start: not pinned to a revision")
    recipe = _import(tmp_path, SOLO)
    assert [item.split(":")[0] for item in recipe.not_carried] == ["model"]


def test_a_plan_value_replaces_the_commands_in_place(tmp_path: Path) -> None:
    recipe = _import(tmp_path, SOLO)
    other = recipe.model_copy(update={"model": "org/other-GGUF:Q8_0", "port": 9000})
    argv = list(plan(other, _cluster(1), "d").ranks[0].argv)
    assert argv[1:3] == ["-hf", "org/other-GGUF:Q8_0"] and argv[argv.index("--port") + 1] == "9000"
    assert argv.count("-hf") == 1 and argv.count("--port") == 1


def test_rpc_two_nodes_head_runs_the_built_command_with_rpc(tmp_path: Path) -> None:
    recipe = _import(tmp_path, RPC)
    assert recipe.required_nodes == 2 and recipe.rendezvous_port == 50052
    planned = plan(recipe, _cluster(2), "d")
    head, worker = planned.ranks
    # _build_rpc_head_command: -hf spec, the flag map over the defaults, --rpc; the template's other
    # flags (--flash-attn on, --jinja, --no-webui, --no-mmap) are not in sparkrun's head command.
    assert list(head.argv) == ["llama-server", "-hf", RPC["model"], "--port", "8000", "--host", "0.0.0.0",
                               "--ctx-size", "262144", "--n-gpu-layers", "99", "--split-mode", "layer",
                               "--rpc", "10.9.0.2:50052"]  # fmt: skip
    # rpc-server on sparkrun's port (bound to the node's fabric address: RPC has no authentication).
    assert list(worker.argv) == ["rpc-server", "--host", "10.9.0.2", "--port", "50052"]
    assert planned.staging == ()
    assert all("HF_HUB_OFFLINE" not in r.env_dict() for r in planned.ranks)


def test_pinning_the_file_stages_it_and_passes_its_path(tmp_path: Path) -> None:
    # What the warning asks for: the repo, the file and the revision; plan then gives -m <path>,
    # as sparkrun's launch does once the GGUF is in the node's cache.
    recipe = _import(tmp_path, SOLO)
    pinned = recipe.model_copy(update={"model": "unsloth/gpt-oss-20b-GGUF", "model_file": "gpt-oss-20b-Q4_K_M.gguf",
                                       "revision": "abc123"})  # fmt: skip
    rank = plan(pinned, _cluster(1), "d").ranks[0]
    argv = list(rank.argv)
    assert "-hf" not in argv and argv[1:3] == [
        "-m",
        "/cache/huggingface/hub/models--unsloth--gpt-oss-20b-GGUF/snapshots/abc123/gpt-oss-20b-Q4_K_M.gguf",
    ]
    assert rank.env_dict()["HF_HUB_OFFLINE"] == "1"


def test_validate_and_plan_warn_by_name_and_strict_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write(tmp_path, SOLO)
    out = tmp_path / "r.toml"
    code, _, _ = run_main(capsys, "import", "sparkrun", str(src), "--out", str(out))
    assert code == 0
    for command in ("validate", "plan"):
        code, _, err = run_main(capsys, command, str(out))
        assert code == 0 and f"not carried over: model: llama.cpp downloads {SPEC} on each node" in _line(err)
        code, _, err = run_main(capsys, command, str(out), "--strict")
        assert code == 2 and "--strict: not carried over by the import: model: llama.cpp downloads" in _line(err)


def test_hf_token_reaches_the_env_never_argv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = _import(tmp_path, SOLO, f'HF_TOKEN = "{TOKEN}"\n')  # the deployment's secret, in [env]
    rank = plan(recipe, _cluster(1), "d").ranks[0]
    assert rank.env_dict()["HF_TOKEN"] == TOKEN
    assert all(TOKEN not in w for w in (*rank.argv, *(rank.container_argv or ())))
    code, shown, err = run_main(capsys, "plan", str(tmp_path / "r.toml"), "--json")
    assert code == 0 and TOKEN not in shown and TOKEN not in err
    assert "-hf" in json.loads(shown)["ranks"][0]["argv"]


def test_a_native_llamacpp_recipe_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "native.toml"
    path.write_text('engine = "llama-cpp"\nmodel = "org/m-GGUF"\nmodel_file = "m.gguf"\nrevision = "r1"\n'
                    'docker_image = "img:1"\nargs = ["--ctx-size", "4096"]\n')  # fmt: skip
    recipe = load_recipe(path)
    assert recipe.command_style == "sparkfleet"
    rank = plan(recipe, _cluster(1), "d").ranks[0]
    assert list(rank.argv) == ["llama-server", "--model",
                               "/root/.cache/huggingface/hub/models--org--m-GGUF/snapshots/r1/m.gguf",
                               "--ctx-size", "4096", "--alias", "org/m-GGUF", "--host", "0.0.0.0",
                               "--port", "8080"]  # fmt: skip
    assert rank.env_dict()["HF_HUB_OFFLINE"] == "1"
    path.write_text('engine = "llama-cpp"\nmodel = "org/m-GGUF:Q4_K_M"\n')
    with pytest.raises(Exception, match="model_file: required for llama-cpp"):
        load_recipe(path)


def test_hf_file_and_equals_spellings_become_one_model_path(tmp_path: Path) -> None:
    recipe = _import(tmp_path, SOLO)
    args = ("--hf-repo=unsloth/gpt-oss-20b-GGUF:Q4_K_M", "--hf-file", "x.gguf", "--jinja")
    pinned = recipe.model_copy(update={"model": "unsloth/gpt-oss-20b-GGUF", "model_file": "x.gguf",
                                       "revision": "r", "args": args})  # fmt: skip
    argv = list(plan(pinned, _cluster(1), "d").ranks[0].argv)
    # The port (8000, not llama-server's 8080) is added where the args lack it.
    assert argv == ["llama-server", "-m", "/cache/huggingface/hub/models--unsloth--gpt-oss-20b-GGUF/snapshots/r/x.gguf",
                    "--jinja", "--port", "8000"]  # fmt: skip
    fetch = recipe.model_copy(update={"args": ("-m", "whatever", "--jinja")})
    assert list(plan(fetch, _cluster(1), "d").ranks[0].argv) == ["llama-server", "-hf", SPEC, "--jinja", "--port",
                                                                  "8000"]  # fmt: skip


def test_rpc_head_special_flags_as_0_4_2_writes_them(tmp_path: Path) -> None:
    # _special_flags after the map: a boolean flash_attn is on/off, a false webui/mmap is --no-….
    data = {**RPC, "defaults": {**RPC["defaults"], "flash_attn": True, "webui": False, "mmap": "false", "jinja": True}}
    head = list(plan(_import(tmp_path, data), _cluster(2), "d").ranks[0].argv)
    assert head[head.index("--split-mode") :] == ["--split-mode", "layer", "--jinja", "--flash-attn", "on",
                                                  "--no-webui", "--no-mmap", "--rpc", "10.9.0.2:50052"]  # fmt: skip


def test_dash_m_repo_quant_plans_the_pinned_path_once_filled(tmp_path: Path) -> None:
    # dgxguy-style `-m {model}` with repo:QUANT: sparkrun's launch passes the downloaded file's
    # container path there; the import leaves the file and revision to pin, then plan does the same.
    data = {**SOLO, "command": SOLO["command"].replace("-hf {model}", "-m {model}")}
    result = import_sparkrun(read_sparkrun(_write(tmp_path, data)))
    assert {n.key for n in result.placeholders} == {"model_file", "revision"}
    text = result.recipe_toml
    for key, value in (("model_file", "gpt-oss-20b-Q4_K_M.gguf"), ("revision", "abc")):
        start = text.index(f"{key} = ")
        text = text[:start] + f'{key} = "{value}"' + text[text.index("\n", start) :]
    (tmp_path / "r.toml").write_text(text)
    recipe = load_recipe(tmp_path / "r.toml")
    assert recipe.model == "unsloth/gpt-oss-20b-GGUF" and not recipe.not_carried
    argv = list(plan(recipe, _cluster(1), "d").ranks[0].argv)
    assert argv[:3] == [
        "llama-server",
        "-m",
        "/cache/huggingface/hub/models--unsloth--gpt-oss-20b-GGUF/snapshots/abc/gpt-oss-20b-Q4_K_M.gguf",
    ]
