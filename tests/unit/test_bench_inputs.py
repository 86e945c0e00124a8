"""Shipped bench text, prefill length planning and the bench options a user types."""

from __future__ import annotations

import pytest

from sparkfleet.bench.corpus import (
    PROMPT_TYPES,
    decode_prompt,
    haystack,
    load_prompts,
    prefill_prompt,
    prompt_types,
)
from sparkfleet.bench.decode import DecodeConfig
from sparkfleet.bench.endpoint import looks_like_url, masked_flags, normalise_url, parallelism
from sparkfleet.bench.prefill import plan_lengths
from sparkfleet.cli.bench import parse_extra
from sparkfleet.cli.int_lists import parse_int_list
from sparkfleet.errors import BenchError


def test_every_prompt_type_ships_several_distinct_prompts() -> None:
    prompts = load_prompts()
    assert set(prompts) == set(PROMPT_TYPES)
    for kind in PROMPT_TYPES:
        assert len(set(prompts[kind])) >= 8


def test_decode_prompts_start_with_a_fresh_nonce() -> None:
    a, b = decode_prompt("prose", 0), decode_prompt("prose", 0)
    assert a != b
    assert a.split("] ", 1)[1] == b.split("] ", 1)[1]


def test_haystack_is_varied_real_text_not_filler() -> None:
    text = haystack(200_000, seed=1)
    assert len(text) == 200_000
    words = text.split()
    # A repeated-token filler has a handful of distinct words; real prose and code thousands.
    assert len(set(words)) > 5_000
    assert "def " in text and "the " in text  # both code and prose
    assert haystack(5000, seed=1) == haystack(5000, seed=1)
    assert haystack(5000, seed=1) != haystack(5000, seed=2)


def test_prefill_prompts_differ_from_their_first_characters() -> None:
    a, b = prefill_prompt(4000, seed=3), prefill_prompt(4000, seed=3)
    assert a[:40] != b[:40]
    assert abs(len(a) - 4000) < 10


def test_prefill_lengths_clip_to_the_context() -> None:
    plan = plan_lengths((4096, 16384, 32768, 65536), 32768)
    assert plan.lengths == (4096, 16384, 32752)
    assert plan.dropped == (32768, 65536)
    assert plan_lengths((4096, 8192), 8192).lengths == (4096, 8176)
    assert plan_lengths((1024, 2048), None).lengths == (1024, 2048)
    assert plan_lengths((4096,), 100_000).dropped == ()


def test_option_parsing_and_bad_input() -> None:
    assert parse_int_list("1,2, 4", "concurrency", BenchError) == (1, 2, 4)
    assert parse_int_list("4k,16k,1000", "prompt length", BenchError) == (4096, 16384, 1000)
    with pytest.raises(BenchError, match="bad concurrency 'x'"):
        parse_int_list("1,x", "concurrency", BenchError)
    with pytest.raises(BenchError, match="bad concurrency '0'"):
        parse_int_list("0", "concurrency", BenchError)
    with pytest.raises(BenchError, match="unknown prompt type poetry"):
        prompt_types("prose,poetry")
    assert parse_extra('{"top_p": 1}') == {"top_p": 1}
    with pytest.raises(BenchError, match="must be a JSON object"):
        parse_extra("[1]")
    with pytest.raises(BenchError, match="not valid JSON"):
        parse_extra("{top_p")
    with pytest.raises(BenchError, match="at least 2"):
        DecodeConfig(new_tokens=1)


def test_targets() -> None:
    assert looks_like_url("http://10.0.0.1:8000")
    assert looks_like_url("spark1:8000")
    assert looks_like_url("spark1:8000/v1")
    assert not looks_like_url("dsv41-tp4")
    assert normalise_url("spark1:8000/v1/") == "http://spark1:8000"


def test_stored_flags_hide_credentials_and_parallelism_is_read() -> None:
    argv = ["vllm", "serve", "/m", "--api-key", "sk-live-123", "--hf-token=hf_abc", "-tp", "4", "--nnodes=2"]
    masked = masked_flags(argv)
    assert "sk-live-123" not in masked and "--hf-token=hf_abc" not in masked
    assert masked[3:6] == ["--api-key", "***", "--hf-token=***"]
    assert parallelism(argv) == {"tp": "4", "nodes": "2"}
    assert parallelism(["python", "-m", "sglang.launch_server", "--tp", "8", "--ep-size", "8"]) == {
        "tp": "8",
        "ep": "8",
    }
