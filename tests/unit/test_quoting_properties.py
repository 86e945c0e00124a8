"""Property tests: whatever a recipe holds, the rendered command line gives back the same words."""

from __future__ import annotations

import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import parse_recipe, unquote_arg
from sparkfleet.plan.build import plan
from sparkfleet.plan.model import Overrides
from tests.conftest import SPARK4

# Any printable text without NUL (argv cannot carry NUL); flags starting with '-' are excluded so
# a generated word never collides with a per-rank flag the launcher reserves.
# No "{{": a {{name}} template is filled (or refused) at load and plan time, tested on its own.
# Hypothesis draws string constants of the project's source too, "{{home}}" among them.
words = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1).filter(
    lambda w: not w.startswith("-") and w.strip()[:1] not in ("'", '"') and "{{" not in w
)
# An env value is one line of the rank's env file: no newline (config/names.py refuses one).
one_line = words.filter(lambda w: "\n" not in w and "\r" not in w)


@settings(max_examples=200, deadline=None)
@given(args=st.lists(words, max_size=6), env_value=one_line)
def test_rendered_argv_round_trips_through_a_shell(args: list[str], env_value: str) -> None:
    recipe = parse_recipe(
        {"engine": "vllm", "model": "org/m", "required_nodes": 2, "tensor_parallel_size": 2,
         "docker_image": "img:1", "args": ["--x", *args], "env": {"VALUE": env_value}},
        "prop.toml",
    )  # fmt: skip
    planned = plan(recipe, load_cluster(SPARK4), "prop", Overrides())
    for rank in planned.ranks:
        assert rank.container_argv is not None
        for line in (rank.argv, rank.container_argv):
            assert shlex.split(shlex.join(line)) == list(line)
        assert list(rank.argv[3 : 4 + len(args)]) == ["--x", *args]
        assert rank.env_dict()["VALUE"] == env_value


@settings(max_examples=300, deadline=None)
@given(word=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1))
def test_a_shell_quoted_item_reaches_the_engine_as_the_shell_would_pass_it(word: str) -> None:
    quoted = shlex.quote(word)
    if quoted[0] in "'\"":
        assert unquote_arg(quoted) == word
        assert unquote_arg("\n" + quoted) == word
    assert shlex.split(shlex.quote(word)) == [word]
