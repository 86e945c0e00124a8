"""Which files of a Hub repo the engine loads (nodes/shipped/hub_fetch.py ``choose``), for the
layouts the integration test's real listing does not have: GGUF quant repos and a Mistral-style
repo whose consolidated checkpoint sits at the root beside the shards."""

from __future__ import annotations

from sparkfleet.config.recipe import Recipe
from sparkfleet.nodes.shipped.hub_fetch import choose
from sparkfleet.plan.engines import engine_for

GGUF_REPO = [
    ".gitattributes", "README.md", "model-Q4_K_M.gguf", "model-Q8_0-00001-of-00002.gguf",
    "model-Q8_0-00002-of-00002.gguf", "model-Q8_0-mtp.gguf", "mmproj-F16.gguf",
]  # fmt: skip


def _profile(engine: str, **fields: object) -> list[str | None]:
    recipe = Recipe(engine=engine, model="org/repo", **fields)  # type: ignore[arg-type]
    return list(engine_for(engine).hub_profile(recipe.launch_spec()))


def test_llamacpp_fetches_the_chosen_quant_only() -> None:
    fetch, skip = choose(GGUF_REPO, _profile("llama-cpp", model_file="model-Q4_K_M.gguf", revision="r"))
    assert fetch == ["model-Q4_K_M.gguf"]
    assert dict(skip)["model-Q8_0-mtp.gguf"] == "another GGUF file: the recipe's model_file is model-Q4_K_M.gguf"


def test_llamacpp_fetches_every_part_of_a_split_quant() -> None:
    profile = _profile("llama-cpp", model_file="model-Q8_0-00001-of-00002.gguf", revision="r")
    fetch, _ = choose(GGUF_REPO, profile)
    assert fetch == ["model-Q8_0-00001-of-00002.gguf", "model-Q8_0-00002-of-00002.gguf"]


def test_safetensors_engines_skip_a_root_checkpoint_the_index_does_not_name() -> None:
    names = ["config.json", "params.json", "consolidated.safetensors", "model-00001-of-00002.safetensors",
             "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tekken.json"]  # fmt: skip
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    for engine in ("vllm", "sglang"):
        fetch, skip = choose(names, _profile(engine), index)
        assert "consolidated.safetensors" not in fetch and set(fetch) >= {"model-00001-of-00002.safetensors"}
        assert (
            dict(skip)["consolidated.safetensors"]
            == "not named by model.safetensors.index.json: a duplicate checkpoint"
        )


def test_pytorch_shards_only_when_the_repo_has_no_safetensors() -> None:
    fetch, _ = choose(["config.json", "pytorch_model-00001-of-00001.bin"], ["safetensors", None])
    assert "pytorch_model-00001-of-00001.bin" in fetch
    fetch, skip = choose(["config.json", "model.safetensors", "pytorch_model.bin"], ["safetensors", None])
    assert fetch == ["config.json", "model.safetensors"] and skip[0][0] == "pytorch_model.bin"
