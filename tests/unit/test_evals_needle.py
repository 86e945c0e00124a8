"""Needle construction and scoring (pure parts)."""

from __future__ import annotations

import random

from sparkfleet.evals.needle import (
    NeedleCell,
    NeedleRun,
    insert_needle,
    make_haystack,
    make_prompt,
    paragraphs,
    score_answer,
)

NEEDLE = "The access code for the amber-otter vault is 4815162."


def test_haystack_is_real_varied_text_from_a_random_start() -> None:
    paras = paragraphs()
    assert len(paras) > 500
    a = make_haystack(20_000, 10, paras)
    b = make_haystack(20_000, 900, paras)
    assert len(a) == len(b) == 20_000
    assert a[:500] != b[:500]
    # Real prose: many distinct words, not a repeated filler.
    assert len(set(a.split())) > 600


def test_needle_depths_land_on_boundaries_in_order() -> None:
    hay = make_haystack(10_000, random.Random(1).randrange(100), paragraphs())
    positions = [insert_needle(hay, NEEDLE, d).index(NEEDLE) for d in (0, 25, 50, 75)]
    assert positions[0] == 0
    assert positions == sorted(positions)
    assert abs(positions[2] - 5_000) < 2_500
    end = insert_needle(hay, NEEDLE, 100)
    assert end.endswith(NEEDLE)
    for d in (25, 50, 75):
        text = insert_needle(hay, NEEDLE, d)
        before = text[: text.index(NEEDLE)]
        assert before.endswith(("\n\n", ". "))


def test_prompt_asks_for_the_key() -> None:
    prompt = make_prompt(insert_needle("Some text. More text.", NEEDLE, 50), "amber-otter")
    assert NEEDLE in prompt and prompt.rstrip().endswith("7-digit code only.")


def test_exact_match_scoring() -> None:
    assert score_answer("4815162", "4815162")
    assert score_answer("The code is 4815162.", "4815162")
    assert not score_answer("48151623", "4815162")
    assert not score_answer("1234567 or maybe 4815162", "4815162")
    assert not score_answer("", "4815162")


def _cell(length: int, depth: float, ok: bool) -> NeedleCell:
    return NeedleCell(length, depth, length, "k", "1234567", "", ok, 1.0, "stop")


def test_effective_length_is_the_longest_length_with_every_depth_passing() -> None:
    cells = (
        _cell(1024, 0, True), _cell(1024, 50, True), _cell(1024, 100, True),
        _cell(2048, 0, True), _cell(2048, 50, False), _cell(2048, 100, True),
        _cell(4096, 0, True), _cell(4096, 50, True), _cell(4096, 100, True),
    )  # fmt: skip
    run = NeedleRun("n", "n", "u", "m", "chat", "exact", 1, (1024, 2048, 4096), (0.0, 50.0, 100.0), (), "t", 1.0, cells)
    assert run.effective_length == 4096
    broken = NeedleRun("n", "n", "u", "m", "chat", "exact", 1, (1024,), (0.0,), (), "t", 1.0, (_cell(1024, 0, False),))
    assert broken.effective_length is None
    assert NeedleRun.from_json(run.to_json()) == run
