"""`sparkfleet up` brings real engines to a real answer, and `down` leaves nothing behind."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.conftest import VLLM_HEADERS, Served
from tests.integration.conftest import leftover_processes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _complete(served: Served, prompt: str, tokens: int = 12, headers: dict[str, str] | None = None) -> str:
    body = {"model": served.model, "prompt": prompt, "max_tokens": tokens, "temperature": 0}
    answer = httpx.post(f"{served.endpoint}/v1/completions", json=body, timeout=120, headers=headers)
    return str(answer.json()["choices"][0]["text"])


def test_llamacpp_example_serves_and_reports(llama_server: Served) -> None:
    assert "Berlin" in _complete(llama_server, "The capital of France is Paris. The capital of Germany is")
    status = json.loads(llama_server.cli("status", llama_server.name, "--json").stdout)[0]
    assert status["status"] == "ready" and status["ranks"][0]["health"] == "healthy"
    logs = llama_server.cli("logs", llama_server.name).stdout
    assert "r0 local | " in logs and "Application startup complete" in logs
    assert leftover_processes(llama_server.name)


def test_vllm_two_node_example_serves_with_a_headless_rank(vllm_server: Served) -> None:
    # Started with an API key (tests/e2e/conftest.py): up's smoke test passed with it, and the
    # engine refuses a request without it.
    prompt = "The capital of France is Paris. The capital of Germany is"
    assert "Berlin" in _complete(vllm_server, prompt, headers=VLLM_HEADERS)
    body = {"model": vllm_server.model, "prompt": prompt, "max_tokens": 1}
    assert httpx.post(f"{vllm_server.endpoint}/v1/completions", json=body, timeout=60).status_code == 401
    status = json.loads(vllm_server.cli("status", vllm_server.name, "--json").stdout)[0]
    assert [(r["node"], r["state"]) for r in status["ranks"]] == [("node0", "running"), ("node1", "running")], status
    logs = vllm_server.cli("logs", vllm_server.name, "--rank", "1", "--tail", "400").stdout
    assert "headless" in logs  # rank 1 really joined as a headless TP worker
