"""Credentials a recipe put in an engine's args, and tokens given with --set: moved to the env
where the engine reads one, else masked in every rendering and stored copy, and warned about."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import parse_recipe
from sparkfleet.exporters.slurm import slurm_script
from sparkfleet.plan.build import plan
from sparkfleet.plan.render import plan_json
from sparkfleet.state.plans import plan_to_json
from tests.cli_run import run_main
from tests.conftest import SPARK4

KEY = "sk-RecipeArgsKey0123456789"


def _plan(engine: str, args: list[str], **extra: object):  # type: ignore[no-untyped-def]
    data = {"engine": engine, "model": "org/m", "args": args, **extra}
    if engine == "llama-cpp":
        data.update(model_file="m.gguf", revision="0" * 40)
    return plan(parse_recipe(data, "r.toml"), load_cluster(SPARK4), "d")


@pytest.mark.parametrize(
    ("engine", "env"), [("vllm", "VLLM_API_KEY"), ("llama-cpp", "LLAMA_API_KEY"), ("llama-cpp", "API_KEY")]
)
@pytest.mark.parametrize("form", ["two-words", "inline"])
def test_an_api_key_flag_moves_to_the_env_var_the_engine_reads(engine: str, env: str, form: str) -> None:
    args = ["--api-key", KEY] if form == "two-words" else [f"--api-key={KEY}"]
    planned = _plan(engine, args)
    rank = planned.ranks[0]
    assert KEY not in " ".join(rank.argv) and "--api-key" not in rank.argv
    assert rank.env_dict()[env] == KEY
    assert KEY not in json.dumps(plan_json(planned)) and KEY not in plan_to_json(planned)
    assert any(env in note for note in planned.secret_args)


def test_where_the_engine_reads_no_env_var_the_key_stays_but_is_masked_everywhere() -> None:
    planned = _plan("sglang", ["--api-key", KEY, "--admin-token=hf_AdminToken123"])
    rank = planned.ranks[0]
    assert KEY in rank.argv  # the engine needs it
    for shown in (json.dumps(plan_json(planned)), plan_to_json(planned), json.dumps(rank.handle.argv)):
        assert KEY not in shown and "hf_AdminToken123" not in shown and "***" in shown
    assert any("ps" in note for note in planned.secret_args)


def test_a_token_shaped_model_is_masked_in_every_shown_command_and_warned_about() -> None:
    # Found by the fuzz of recipes (test_fuzz_inputs.py): a model named like a key reached argv as shown.
    planned = plan(parse_recipe({"engine": "vllm", "model": KEY}, "r.toml"), load_cluster(SPARK4), "d")
    rank = planned.ranks[0]
    assert KEY in rank.argv  # the engine needs it
    shown = [r["argv"] for r in plan_json(planned)["ranks"]], rank.handle.argv
    assert KEY not in json.dumps(shown) and "***" in json.dumps(shown)
    assert any(note.startswith("model: shaped like a token") for note in planned.secret_args)


def test_the_slurm_export_never_writes_an_args_key(tmp_path: Path) -> None:
    recipe = parse_recipe({"engine": "sglang", "model": "org/m", "args": ["--api-key", KEY]}, "r.toml")
    assert KEY not in slurm_script(recipe, "d")


def test_validate_and_plan_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "recipe.toml").write_text(f'engine = "sglang"\nmodel = "org/m"\nargs = ["--api-key", "{KEY}"]\n')
    code, out, err = run_main(capsys, "validate", str(tmp_path))
    assert code == 0 and "warning" in err and "--api-key" in err and KEY not in out + err
    code, out, err = run_main(capsys, "plan", str(tmp_path), "--json")
    assert code == 0 and "warning" in err and KEY not in out + err


def test_a_token_given_with_set_is_an_env_value_never_recorded(tmp_path: Path) -> None:
    from sparkfleet.apply.configurations import ConfigSpec

    (tmp_path / "recipe.toml").write_text('engine = "vllm"\nmodel = "org/m"\n')
    spec = ConfigSpec(tmp_path, sets=("env.HF_TOKEN=hf_SetToken12345", "port=9000"))
    assert spec.sets == ("port=9000",) and ("HF_TOKEN", "hf_SetToken12345") in spec.env
    planned = spec.plan()
    assert planned.ranks[0].env_dict()["HF_TOKEN"] == "hf_SetToken12345" and planned.port == 9000
