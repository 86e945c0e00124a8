"""[variants.NAME] overlays: chains resolve in order, --diff names exactly what changed, and a
mistake in a variant is one line naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.errors import RecipeError
from sparkfleet.plan.build import plan
from tests.cli_run import run_main
from tests.conftest import SEEDS, SPARK4

RECIPE = """
engine = "vllm"
model = "org/model"
required_nodes = 2
tensor_parallel_size = 2
port = 8000
docker_image = "img:stable"
args = ["--max-model-len", "8192", "--enforce-eager", "--gpu-memory-utilization=0.8", "--disable-log-stats"]

[env]
KEEP = "1"
DROP_ME = "1"
MODE = "plain"

[variants.canary]
description = "the canary image, same flags"
docker_image = "img:canary"
[variants.canary.env]
MODE = "canary"

[variants.fast]
extends = "canary"
port = 9000
env_unset = ["DROP_ME"]
args_set = ["--max_model_len", "4096", "--kv-cache-dtype", "fp8"]
args_remove = ["--enforce-eager"]
args_add = ["--lora-modules", "a=/a", "--lora-modules", "b=/b"]
[variants.fast.env]
NEW = "x"
"""


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    return path


def test_a_chain_applies_the_root_first_and_the_named_variant_last(recipe: Path) -> None:
    base = load_recipe(recipe)
    assert base.variant == "base" and base.docker_image == "img:stable" and base.env["MODE"] == "plain"
    fast = load_recipe(recipe, variant="fast")
    assert fast.variant == "fast"
    assert fast.docker_image == "img:canary"  # from canary, which fast extends
    assert fast.env == {"KEEP": "1", "MODE": "canary", "NEW": "x"}
    assert fast.port == 9000
    # replaced where it stood (written with _ here: the same flag), removed, appended twice
    assert fast.args == ("--max_model_len", "4096", "--gpu-memory-utilization=0.8", "--disable-log-stats",
                         "--kv-cache-dtype", "fp8", "--lora-modules", "a=/a", "--lora-modules", "b=/b")  # fmt: skip


def test_set_overrides_apply_on_top_of_the_variant(recipe: Path) -> None:
    assert load_recipe(recipe, ("port=9100",), variant="fast").port == 9100


def test_diff_names_exactly_the_changed_words_env_keys_and_image(
    recipe: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(capsys, "plan", str(recipe), "--cluster", str(SPARK4), "--diff", "base", "fast", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["a"], doc["b"]) == ("base", "fast")
    base = plan(load_recipe(recipe), load_cluster(SPARK4), "recipe")
    for rank in doc["ranks"]:
        assert rank["image"] == {"a": "img:stable", "b": "img:canary"}
        assert rank["env"] == {"added": {"NEW": "x"}, "removed": {"DROP_ME": "1"},
                               "changed": {"MODE": {"a": "plain", "b": "canary"}}}  # fmt: skip
        removed = [w for change in rank["argv"] for w in change["a"]]
        added = [w for change in rank["argv"] for w in change["b"]]
        # args_set wrote the flag with _: the same option, replaced in place, but another word
        port = {0: ["8000"], 1: []}[rank["rank"]]  # only rank 0 serves HTTP (rank 1 is headless)
        assert sorted(removed) == sorted(["--max-model-len", "8192", "--enforce-eager", *port])
        assert sorted(added) == sorted(["--max_model_len", "4096", "--kv-cache-dtype", "fp8", "--lora-modules",
                                        "a=/a", "--lora-modules", "b=/b", *(["9000"] if port else [])])  # fmt: skip
        argv = base.ranks[rank["rank"]].argv
        for change in rank["argv"]:  # each change points at A's words where they are
            assert list(argv[change["at"] : change["at"] + len(change["a"])]) == change["a"]
    code, out, _ = run_main(capsys, "plan", str(recipe), "--cluster", str(SPARK4), "--diff", "base", "fast")
    assert code == 0
    assert "- img:stable" not in out and "- image img:stable" in out and "+ image img:canary" in out
    assert "- DROP_ME=1" in out and "+ NEW=x" in out and "- MODE=plain" in out and "+ MODE=canary" in out


def test_identical_variants_diff_to_nothing(recipe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe.write_text(RECIPE + '\n[variants.same]\nextends = "base"\n')
    code, out, _ = run_main(capsys, "plan", str(recipe), "--cluster", str(SPARK4), "--diff", "base", "same")
    assert code == 0 and "no difference" in out


def test_plan_variant_json_names_the_variant(recipe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "plan", str(recipe), "--cluster", str(SPARK4), "--variant", "canary", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["variant"] == "canary" and {r["image"] for r in doc["ranks"]} == {"img:canary"}
    code, out, _ = run_main(capsys, "plan", str(recipe), "--cluster", str(SPARK4), "--variant", "canary")
    assert code == 0 and "variant canary" in out


@pytest.mark.parametrize(
    ("edit", "variant", "line"),
    [
        ("[variants.x]\nportt = 1\n", "base", "variants.x.portt: unknown key (did you mean 'port'?)"),
        ("[variants.x]\nextends = \"canry\"\n", "x", "variants.x.extends: no variant 'canry' (did you mean 'canary'?)"),
        ("[variants.x]\nextends = \"y\"\n[variants.y]\nextends = \"x\"\n", "x",
         "variants.y.extends: the chain is a loop"),
        ("[variants.x]\nport = 0\n", "x", "variants.x.port: Input should be greater than or equal to 1"),
        ("[variants.x]\nenv_unset = [\"KEPP\"]\n", "x",
         "variants.x.env_unset: 'KEPP' is not set by the env it overlays (did you mean 'KEEP'?)"),
        ("[variants.x]\nargs_remove = [\"--enforce-eagr\"]\n", "x",
         "variants.x.args_remove: --enforce-eagr is not in the args it overlays (did you mean '--enforce-eager'?)"),
        ("[variants.x]\nargs_set = [\"4096\"]\n", "x", "variants.x.args_set: must start with a flag"),
        ("[variants.base]\nport = 1\n", "base", "variants.base: 'base' is the recipe without any overlay"),
        ("", "fsat", "no variant 'fsat' (did you mean 'fast'?); it has: base, canary, fast"),
    ],
)  # fmt: skip
def test_a_bad_variant_is_one_line_naming_the_file_and_key(recipe: Path, capsys: pytest.CaptureFixture[str],
                                                           edit: str, variant: str, line: str) -> None:  # fmt: skip
    recipe.write_text(RECIPE + "\n" + edit)
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe, variant=variant)
    assert caught.value.message.startswith(f"{recipe}: ") and line in caught.value.message
    code, out, err = run_main(capsys, "plan", str(recipe), "--variant", variant, "--cluster", str(SPARK4))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and line in " ".join(err.split()) and "Traceback" not in err


def test_validate_checks_every_variant(recipe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "validate", str(recipe))
    assert code == 0 and "variants: canary, fast" in " ".join(out.split())
    recipe.write_text(RECIPE + '\n[variants.broken]\nargs_set = ["--port", "1"]\n')
    code, _, err = run_main(capsys, "validate", str(recipe))
    assert code == 2 and "variant 'broken'" in err and "--port" in err


def test_seed_recipes_are_their_own_base_variant() -> None:
    for seed in ("dsv41-flash-4x-mia", "dsv41-flash-eugr-0913-4x"):
        assert load_recipe(SEEDS / seed).variant == "base"
