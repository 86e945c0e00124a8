"""Recipes and clusters as a careless or hostile user might write them: whatever the files hold,
``plan`` ends in a valid plan (exit 0, JSON) or in one ``error:`` line with exit 2 — never an
internal error or a traceback. 1,000 cases under CI (``CI=true``), 150 locally."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.cli_run import run_main

EXAMPLES = 1000 if os.environ.get("CI") == "true" else 150

# Text TOML can carry: no surrogates (json.dumps would write them as \ud8xx, which TOML refuses).
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
SECRETS = ("sk-" + "a" * 20, "hf_" + "b" * 10)  # token-shaped: masked in every rendering
plausible = st.sampled_from(
    [
        "",
        "-",
        "--api-key",
        *SECRETS,
        "a b",
        "../x",
        "x\ny",
        "{{rank}}",
        "{{nope}}",
        "<SET ME: x>",
        "127.0.0.1",
        "localhost",
        "-oProxyCommand=id",
    ]
)
word = st.one_of(text, plausible)
scalar = st.one_of(word, st.integers(min_value=-(2**63), max_value=2**63 - 1), st.booleans(),
                   st.floats(allow_nan=False, allow_infinity=False))  # fmt: skip
value = st.recursive(
    scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(word, inner, max_size=4)),
    max_leaves=12,
)
count = st.one_of(st.integers(min_value=-3, max_value=6), st.integers(), word)
env_table = st.one_of(st.dictionaries(st.one_of(st.sampled_from(["HF_TOKEN", "X", "A_TOKEN", "1X"]), word), word,
                                      max_size=3), value)  # fmt: skip

RECIPE_KEYS: dict[str, Any] = {
    "engine": st.one_of(st.sampled_from(["vllm", "sglang", "llama-cpp"]), word),
    "model": st.one_of(st.sampled_from(["org/model", "/models/x.gguf"]), word),
    "port": count,
    "rendezvous_port": count,
    "required_nodes": count,
    "tensor_parallel_size": count,
    "pipeline_parallel_size": count,
    "args": st.one_of(st.lists(word, max_size=6), value),
    "env": env_table,
    "entrypoint": st.one_of(st.lists(word, max_size=3), value),
    "docker_image": word,
    "served_model_name": word,
    "model_file": word,
    "shm_size": word,
    "name": word,
    "verify": st.one_of(
        st.fixed_dictionaries({}, optional={"expect": st.lists(word, max_size=2), "timeout": count}), value
    ),
    "staging": value,
    "variants": value,
    "extra_mounts": value,
    "serve": value,
    "memory": value,
    "bogus": value,
}
NODE_KEYS: dict[str, Any] = {
    "name": st.one_of(st.sampled_from(["n0", "n1", "n2"]), word),
    "host": st.one_of(st.sampled_from(["127.0.0.1", "localhost", "spark-1", "-oProxyCommand=id", "a b"]), word),
    "fabric_ip": st.one_of(st.sampled_from(["10.0.0.1", "::1"]), word),
    "user": st.one_of(st.sampled_from(["root", "-l", "me"]), word),
    "ssh_port": count,
    "transport": st.one_of(st.sampled_from(["ssh", "local"]), word),
    "env": env_table,
    "gpus": word,
    "memlock": word,
    "bind_address": st.one_of(st.sampled_from(["fabric", "0.0.0.0"]), word),
    "state_dir": word,
    "bogus": value,
}


def _table(keys: dict[str, Any], required: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({k: keys[k] for k in required},
                                 optional={k: v for k, v in keys.items() if k not in required})  # fmt: skip


# Close to a valid recipe and cluster, one value at a time off: most of these plan.
near_recipes = st.integers(1, 3).flatmap(
    lambda n: st.fixed_dictionaries(
        {
            "engine": st.sampled_from(["vllm", "sglang", "llama-cpp"]),
            "model": st.just("org/model"),
            "required_nodes": st.just(n),
            "tensor_parallel_size": st.just(n),
        },
        optional={
            "args": st.lists(st.sampled_from(["--x", "1", "--api-key", *SECRETS, "a b", "{{rank}}", "-"]), max_size=4),
            "env": st.dictionaries(st.sampled_from(["HF_TOKEN", "X", "A_TOKEN", "MY_API_KEY"]), word, max_size=2),
            "port": st.integers(1, 70000),
            "docker_image": st.sampled_from(["img:1", "", "a b"]),
            "entrypoint": st.lists(st.sampled_from(["/usr/bin/python3", "x", "--y"]), min_size=1, max_size=2),
        },
    )
)
near_clusters = st.fixed_dictionaries(
    {"name": st.just("fuzz"),
     "nodes": st.lists(st.fixed_dictionaries(
         {"name": st.sampled_from(["n0", "n1", "n2", "n3"]),
          "host": st.one_of(st.sampled_from(["127.0.0.1", "localhost", "spark-1", "10.0.0.9", "spark-2"]),
                            st.sampled_from(["a b", "-oProxyCommand=id", "x\ny", "", "-"]))},
         optional={"fabric_ip": st.sampled_from(["10.0.0.1", "10.0.0.2", "::1", "x y"]),
                   "user": st.sampled_from(["root", "me", "-l"]), "env": st.dictionaries(st.just("A"), word),
                   "bind_address": st.sampled_from(["fabric", "0.0.0.0", "nope"])}),
         min_size=1, max_size=4, unique_by=lambda n: n["name"])},
)  # fmt: skip
recipes = st.one_of(near_recipes, _table(RECIPE_KEYS, ("engine", "model")), _table(RECIPE_KEYS, ()))
clusters = st.one_of(near_clusters, st.fixed_dictionaries(
    {"name": st.one_of(st.just("fuzz"), word), "nodes": st.one_of(st.lists(_table(NODE_KEYS, ("name", "host")),
                                                                           min_size=1, max_size=3), value)},
    optional={"defaults": st.one_of(_table({k: v for k, v in NODE_KEYS.items() if k not in ("name", "host",
                                                                                             "fabric_ip", "env")},
                                           ()), value)},
))  # fmt: skip


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def to_toml(data: dict[str, Any]) -> str:
    """data as TOML, every table inline (enough for any nesting the strategies make)."""
    return "".join(f"{json.dumps(k, ensure_ascii=False)} = {_toml_value(v)}\n" for k, v in data.items())


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])  # fmt: skip
@given(recipe=recipes, cluster=clusters)
def test_any_recipe_and_cluster_plan_or_fail_in_one_line(
    recipe: dict[str, Any], cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "fuzz"
        folder.mkdir()
        (folder / "recipe.toml").write_text(to_toml(recipe))
        (Path(tmp) / "cluster.toml").write_text(to_toml(cluster))
        code, out, err = run_main(capsys, "plan", str(folder), "--cluster", str(Path(tmp) / "cluster.toml"),
                                  "--json")  # fmt: skip
    assert "internal error" not in err and "Traceback" not in err, err
    event(f"exit {code}")
    if code == 0:  # a valid plan: nothing in it a node's shell, ssh or env file would misread
        planned = json.loads(out)
        assert planned["ranks"], out
        assert re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,62}", planned["name"]) and ".." not in planned["name"]
        for rank in planned["ranks"]:
            assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*", rank["host"]), rank["host"]
            assert not any("\n" in str(v) for v in rank["env"].values()), rank["env"]
            words = json.dumps([rank["argv"], rank["container_argv"]])
            assert not any(s in words for s in SECRETS), words
        return
    assert code == 2, (code, err)
    assert err.startswith("error: ") and err.count("error: ") == 1, err
