"""The gateway's pure parts: the loop detector's three rules, and its settings file."""

from __future__ import annotations

import dataclasses
import random
import re
import tomllib
from pathlib import Path

import pytest

from sparkfleet.errors import SparkfleetError
from sparkfleet.gateway.config import GatewayConfig, LoopAbort, load, parse, with_overrides
from sparkfleet.gateway.loop import LoopDetector

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway" / "gateway.toml"


def first_loop(pieces: list[str], rules: LoopAbort = LoopAbort()) -> tuple[int, str] | None:
    detector = LoopDetector(rules)
    for i, piece in enumerate(pieces, 1):
        reason = detector.feed(piece)
        if reason:
            return i, reason
    return None


def test_four_copies_of_a_stretch_of_at_least_32_tokens() -> None:
    stretch = [f" w{i}" for i in range(40)]
    # Three copies, and the fourth as soon as its first 32 tokens repeat the others' (3 x 40 + 32).
    assert first_loop(stretch * 5) == (152, "4 copies of a 40-token stretch")
    # A short period repeats as the smallest multiple of it that is >= 32 tokens: 2 x 16 = 32.
    assert first_loop([" a", " b"] * 100) == (128, "4 copies of a 32-token stretch")
    # Three copies are not a loop, wherever they are.
    prefix = [f" p{i}" for i in range(100)]
    assert first_loop(prefix + stretch * 3 + [f" x{i}" for i in range(200)]) is None


def test_identical_tokens_and_lines_in_a_row() -> None:
    assert first_loop(["!"] * 100) == (64, "64 identical tokens in a row")
    lines = ["The cat", " sat", ".\n"] * 20  # one line in three pieces: 8 lines = 24 pieces
    assert first_loop(lines) == (24, "8 identical lines in a row")
    # Blank lines neither count nor break a run; a different line does.
    assert first_loop(["same\n", "\n"] * 8) == (15, "8 identical lines in a row")
    assert first_loop(["same\n", "\n"] * 7 + ["other\n"] + ["same\n"] * 7) is None


def test_ordinary_text_is_no_loop_and_zero_turns_a_rule_off() -> None:
    rng = random.Random(7)
    words = [f" w{rng.randrange(300)}" for _ in range(30_000)]
    assert first_loop(words) is None
    assert first_loop(["!"] * 200, LoopAbort(token_repeats=0)) == (128, "4 copies of a 32-token stretch")
    assert first_loop(["!"] * 500, LoopAbort(0, 0, 0, 0)) is None
    assert not LoopAbort(0, 0, 0, 0).enabled


def test_the_example_config_loads_and_shows_every_setting() -> None:
    config = load(EXAMPLE)
    text = EXAMPLE.read_text()
    settings = {f.name for f in dataclasses.fields(GatewayConfig)} - {"routes", "default_max_new_tokens",
                                                                        "default_loop"}  # fmt: skip
    settings |= {f.name for f in dataclasses.fields(LoopAbort)} | {"max_new_tokens", "loop_abort", "targets",
                                                                    "upstream_model", "fields", "aliases"}  # fmt: skip
    for name in settings:
        assert re.search(rf"^#? ?{name} =|[{{ ]{name} =|\.{name}[\].]|^\[{name}\]", text, re.M), name
    # Its commented defaults are the defaults.
    top = tomllib.loads(text)
    for f in dataclasses.fields(GatewayConfig):
        if f.name in top and f.name != "routes":
            assert getattr(config, f.name) == getattr(GatewayConfig(), f.name), f.name
    thinking = next(r for r in config.routes if r.model == "gemma3-270m-thinking")
    assert dict(thinking.fields) == {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "high",
                                     "temperature": 0.7}  # fmt: skip
    assert thinking.upstream_model == "gemma3-270m" and thinking.loop.line_repeats == 12


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prot = 1\n", "unknown key 'prot'"),
        ("port = true\n", "port = True is not a int"),
        ("max_new_tokens = -1\n", "must not be negative"),
        ("[loop_abort]\nngrams = 3\n", "loop_abort: unknown key 'ngrams'"),
        ("[routes.m]\ntargets = [1]\n", "[routes.'m']: targets must be a list"),
    ],
)
def test_a_mistake_in_the_settings_names_the_file_and_key(text: str, message: str) -> None:
    with pytest.raises(SparkfleetError, match=re.escape(message)) as err:
        parse(tomllib.loads(text), "gw.toml")
    assert err.value.message.startswith("gw.toml")


def test_command_line_routes_and_cap_go_over_the_file() -> None:
    base = parse(tomllib.loads('max_new_tokens = 100\n[routes.m]\ntargets = ["a"]\n'), "gw.toml")
    config = with_overrides(base, ["m=http://h:1", "n=dep"], "0.0.0.0", 9000, 50, no_auth=True)
    routes = {r.model: r for r in config.routes}
    assert routes["m"].targets == ("a", "http://h:1") and routes["n"].targets == ("dep",)
    assert {r.max_new_tokens for r in config.routes} == {50} and config.default_max_new_tokens == 50
    assert (config.host, config.port, config.auth) == ("0.0.0.0", 9000, False)
    quiet = with_overrides(base, ["n=dep"], None, None, None, no_auth=False, no_loop_abort=True)
    assert not quiet.default_loop.enabled and not any(r.loop.enabled for r in quiet.routes)
    assert all(r.loop.enabled for r in config.routes)
    with pytest.raises(SparkfleetError, match="expected MODEL=TARGET"):
        with_overrides(base, ["m"], None, None, None, no_auth=False)


def test_request_log_keeps_the_newest_rows_and_since_reads_back_from_a_moment(tmp_path: Path) -> None:
    import time

    from sparkfleet.gateway import db
    from sparkfleet.gateway.keys import parse_since
    from sparkfleet.gateway.observe import RequestLog, Row

    now = time.time()
    log = RequestLog(db.connect(tmp_path / "gateway.db"), keep_days=1, keep_rows=5)
    log.add(Row(time=now - 3 * 86400, request_id="old", key_name="k", model="m", deployment="d", status=200))
    for i in range(8):
        log.add(Row(time=now - 60 + i, request_id=f"r{i}", key_name="k", model="m", deployment="d", status=200))
    log.flush()
    rows = db.read_log(db.connect(tmp_path / "gateway.db"), None, 100)
    assert [r["request_id"] for r in rows] == ["r3", "r4", "r5", "r6", "r7"]  # older than a day, and beyond 5: gone
    since = db.read_log(db.connect(tmp_path / "gateway.db"), parse_since("55s", now), 100)
    assert [r["request_id"] for r in since] == ["r5", "r6", "r7"]
    assert parse_since("2026-12-01", now) == 1_796_083_200.0  # a date: midnight UTC
    with pytest.raises(SparkfleetError, match="--since 'yesterday': expected a duration"):
        parse_since("yesterday", now)


def test_an_alias_merges_its_tables_into_the_routes() -> None:
    text = """
[routes.m]
targets = ["d"]
fields = { chat_template_kwargs = { reasoning_effort = 75 }, temperature = 0.2 }
[routes.m.aliases.m-thinking]
chat_template_kwargs = { thinking = true }
"""
    routes = {r.model: dict(r.fields) for r in parse(tomllib.loads(text), "gw.toml").routes}
    assert routes["m-thinking"] == {"chat_template_kwargs": {"reasoning_effort": 75, "thinking": True},
                                    "temperature": 0.2}  # fmt: skip
