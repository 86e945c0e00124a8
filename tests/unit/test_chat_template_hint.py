"""A base model without a chat template gets one line naming `--api completions` (bench/chat_api.py):
the real answers of llama-server and vLLM for Gemma 3 270M base (tests/fixtures/llama-server-gemma-base,
tests/fixtures/vllm-gemma-base) and SGLang's refusal, replayed to `bench decode|serve` and `eval quality`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkfleet.bench.chat_api import HINT, has_own_template, refuses_chat
from tests.cli_run import run_main
from tests.replay_server import ReplayServer, Script

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GEMMA = FIXTURES / "llama-server-gemma-base"
# vLLM 0.32.0's real answer (tests/fixtures/vllm-gemma-base); SGLang's passes on transformers'
# apply_chat_template error (no SGLang was installed where these were captured: its text, not a capture).
VLLM_400 = json.loads((FIXTURES / "vllm-gemma-base" / "chat.json").read_text())
SGLANG_400 = {"object": "error", "message": "Cannot use chat template functions because tokenizer.chat_template is "
              "not set and no template argument was passed! For information about writing templates and setting "
              "the tokenizer.chat_template attribute, please see the documentation at "
              "https://huggingface.co/docs/transformers/main/en/chat_templating", "type": "BadRequest",
              "param": None, "code": 400}  # fmt: skip
DECODE = ("--concurrency", "1", "--types", "prose", "--output-len", "4", "--repeats", "1", "--warmups", "0")


def _load(name: str) -> Any:
    return json.loads((GEMMA / name).read_text())


def test_llama_server_props_tell_a_gguf_without_a_template() -> None:
    props = _load("props.json")
    assert has_own_template(props) is False  # Gemma's <bos>/<eos>, framed in llama.cpp's ChatML fallback
    assert has_own_template(json.loads((FIXTURES / "llama-server-h200" / "props.json").read_text())) is False
    assert has_own_template({**props, "chat_template": "{{ bos_token }}{% for m in messages %}…"}) is True
    assert has_own_template({**props, "eos_token": "<|im_end|>"}) is True  # a ChatML model of its own
    assert has_own_template({"build_info": "b1"}) is None and has_own_template(None) is None
    # What that fallback does to a base model (the capture): it echoes the question and starts a ChatML
    # token it never learnt, where the completions endpoint answers.
    assert "<|im" in _load("chat.json")["choices"][0]["message"]["content"]
    assert "5" in _load("completions.json")["choices"][0]["text"]


def test_refusals_of_chat_are_told_from_other_errors() -> None:
    assert (FIXTURES / "vllm-gemma-base" / "chat.status").read_text().strip() == "400"
    assert refuses_chat(f"HTTP 400: {VLLM_400['error']['message']}")
    assert refuses_chat(f"HTTP 400: {SGLANG_400['message']}")
    assert not refuses_chat("HTTP 400: max_tokens must be at least 1")
    assert not refuses_chat("ReadTimeout: chat template rendering took too long")  # not the server's refusal
    assert not refuses_chat(None)


def _llama_server() -> ReplayServer:
    return ReplayServer(Script(base_ttft=0.005, itl=0.002, owned_by="llamacpp", model="gemma3-270m",
                               props=_load("props.json")))  # fmt: skip


@pytest.mark.parametrize("command", ["decode", "serve"])
def test_llama_server_chat_through_its_fallback_gets_one_warning_line(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    args = DECODE if command == "decode" else ("--num-prompts", "2", "--output-len", "4", "--discard-runs", "0")
    with _llama_server().running() as server:
        code, _, err = run_main(capsys, "bench", command, server.url, *args)
        assert code == 0, err
        hints = [line for line in err.splitlines() if "--api completions" in line]
        assert hints == [f"warning: gemma3-270m has no chat template of its own (llama-cpp frames chat messages in "
                         f"its ChatML fallback): {HINT}"]  # fmt: skip
        code, _, err = run_main(capsys, "bench", command, server.url, *args, "--api", "completions")
        assert code == 0 and "--api completions" not in err, err


@pytest.mark.parametrize("body", [VLLM_400, SGLANG_400], ids=["vllm", "sglang"])
def test_an_engine_refusing_chat_is_one_error_line_naming_api_completions(
    capsys: pytest.CaptureFixture[str], body: dict[str, Any]
) -> None:
    def answer(request: dict[str, Any]) -> Script:
        refused = "messages" in request
        return Script(base_ttft=0.005, itl=0.002, status=400 if refused else 200, error_body=body if refused else None)

    with ReplayServer(answer).running() as server:
        code, out, err = run_main(capsys, "bench", "decode", server.url, *DECODE)
        assert code == 2 and out == ""
        (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
        assert "cannot chat with replay-model" in line and line.endswith(f"({HINT})")
        code, _, err = run_main(capsys, "bench", "serve", server.url, "--num-prompts", "2", "--discard-runs", "0")
        assert code == 2 and err.strip().splitlines()[-1].endswith(f"({HINT})"), err
        code, _, err = run_main(capsys, "bench", "decode", server.url, *DECODE, "--api", "completions")
        assert code == 0, err
        # eval quality's default (--api auto) asks chat once and takes completions when refused.
        code, out, err = run_main(capsys, "eval", "quality", server.url, "--only", "math_multiply", "--json")
        assert code == 0, err
        assert json.loads(out)["prompt_format"].startswith("completions: /v1/completions")
        code, _, err = run_main(capsys, "eval", "quality", server.url, "--only", "math_multiply", "--api", "chat")
        assert code == 2 and HINT in err, err
