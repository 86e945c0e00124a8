"""A small non-streaming OpenAI-compatible client for evals: one request at a time, greedy.

Two prompt formats, chosen per endpoint and recorded with every run:
- ``chat``: ``/v1/chat/completions`` with the server's chat template, and
  ``chat_template_kwargs.enable_thinking`` per task (dropped for good if the server rejects it);
- ``completions``: ``/v1/completions`` with a plain "Question:/Answer:" frame, for base models
  and servers without a chat template.
Reasoning is returned apart from the answer: the ``reasoning_content`` (or ``reasoning``) field
and any ``<think>…</think>`` span in the content.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from sparkfleet.bench.chat_api import HINT, refuses_chat
from sparkfleet.errors import EvalError
from sparkfleet.evals.extract import strip_reasoning

Api = Literal["chat", "completions"]
COMPLETION_FRAME = "Question: {prompt}\nAnswer:"
COMPLETION_STOP = ("\nQuestion:", "\nAnswer:")


@dataclass(frozen=True)
class Reply:
    """One answer, with its reasoning separated and the server's accounting."""

    content: str
    reasoning_chars: int
    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int | None
    seconds: float


def _usage(body: dict[str, Any], key: str) -> int | None:
    usage = body.get("usage") or {}
    value = usage.get(key)
    return int(value) if isinstance(value, int) else None


class EvalClient:
    """Greedy requests against one server; errors become EvalError naming the URL."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        seed: int = 0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.seed = seed
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout, headers=headers)
        # None: not tried yet; False: the server refused chat_template_kwargs once.
        self.thinking_control: bool | None = None

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        url = f"{self.base_url}{path}"
        try:
            return self.http.post(url, json=body)
        except httpx.TimeoutException as exc:
            raise EvalError(f"{url}: no answer within {self.http.timeout.read}s") from exc
        except httpx.HTTPError as exc:
            raise EvalError(f"{url}: {exc}") from exc

    def _json(self, response: httpx.Response, path: str) -> dict[str, Any]:
        if response.status_code != 200:
            hint = (
                f" ({HINT})"
                if path == "/v1/chat/completions" and refuses_chat(f"HTTP {response.status_code}: {response.text}")
                else ""
            )
            raise EvalError(f"{self.base_url}{path} returned HTTP {response.status_code}: {response.text[:300]}{hint}")
        try:
            body = response.json()
        except ValueError as exc:
            raise EvalError(f"{self.base_url}{path} did not return JSON") from exc
        if not isinstance(body, dict) or not body.get("choices"):
            raise EvalError(f"{self.base_url}{path} returned no choices: {str(body)[:300]}")
        return body

    def chat_probe(self) -> str | None:
        """Why chat is unusable here, or None when a short chat question gets a real answer.

        A 200 is not enough: llama-cpp-python answers chat requests for a GGUF without a
        template through a fallback (llama-2) format, and a base model then says nothing.
        """
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "What is 2 + 3? Answer with just the number."}],
            "max_tokens": 16,
            "temperature": 0,
        }
        try:
            response = self.http.post(f"{self.base_url}/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            return f"chat request failed ({exc})"
        if response.status_code != 200:
            if refuses_chat(f"HTTP {response.status_code}: {response.text}"):
                return f"chat returned HTTP {response.status_code}, no chat template ({HINT})"
            return f"chat returned HTTP {response.status_code} (no chat template?)"
        try:
            choice = response.json()["choices"][0]
            message = choice.get("message") or {}
        except (ValueError, KeyError, IndexError, TypeError):
            return "chat returned no choices"
        text = strip_reasoning(message.get("content") or "")
        if not text and not (message.get("reasoning_content") or message.get("reasoning")):
            return "chat probe got an empty answer (no usable chat template, or a base model)"
        return None

    def chat(self, prompt: str, *, max_tokens: int, thinking: bool) -> Reply:
        """One greedy chat turn; thinking is asked for (or not) through the chat template."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "seed": self.seed,
            "stream": False,
        }
        if self.thinking_control is not False:
            body["chat_template_kwargs"] = {"enable_thinking": thinking, "thinking": thinking}
        start = time.monotonic()
        response = self._post("/v1/chat/completions", body)
        if response.status_code == 400 and "chat_template_kwargs" in body:
            # An engine that validates its request strictly: ask again without the switch.
            self.thinking_control = False
            body.pop("chat_template_kwargs")
            start = time.monotonic()
            response = self._post("/v1/chat/completions", body)
        elif self.thinking_control is None and response.status_code == 200:
            self.thinking_control = True
        data = self._json(response, "/v1/chat/completions")
        seconds = time.monotonic() - start
        choice = data["choices"][0]
        message = choice.get("message") or {}
        raw = message.get("content") or ""
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        return self._reply(raw, reasoning, choice, data, seconds)

    def complete(self, prompt: str, *, max_tokens: int) -> Reply:
        """One greedy completion of the plain Question/Answer frame (base models)."""
        body = {
            "model": self.model,
            "prompt": COMPLETION_FRAME.format(prompt=prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "seed": self.seed,
            "stop": list(COMPLETION_STOP),
            "stream": False,
        }
        start = time.monotonic()
        data = self._json(self._post("/v1/completions", body), "/v1/completions")
        seconds = time.monotonic() - start
        choice = data["choices"][0]
        return self._reply(choice.get("text") or "", "", choice, data, seconds)

    def complete_raw(self, prompt: str, *, max_tokens: int) -> str:
        """The greedy continuation of ``prompt`` as is (no frame, no stop): for engine cross-checks."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        data = self._json(self._post("/v1/completions", body), "/v1/completions")
        return str(data["choices"][0].get("text") or "")

    def ask(self, api: Api, prompt: str, *, max_tokens: int, thinking: bool) -> Reply:
        """Dispatch to chat or completions."""
        if api == "chat":
            return self.chat(prompt, max_tokens=max_tokens, thinking=thinking)
        return self.complete(prompt, max_tokens=max_tokens)

    @staticmethod
    def _reply(raw: str, reasoning: str, choice: dict[str, Any], data: dict[str, Any], seconds: float) -> Reply:
        content = strip_reasoning(raw)
        # Reasoning shows up in its own field or inline as <think>…</think>; both are counted.
        inline = len(raw.strip()) - len(content) if "think>" in raw.lower() else 0
        return Reply(
            content=content,
            reasoning_chars=len(reasoning) + inline,
            finish_reason=str(choice.get("finish_reason") or "unknown"),
            prompt_tokens=_usage(data, "prompt_tokens"),
            completion_tokens=_usage(data, "completion_tokens"),
            seconds=seconds,
        )

    def count_tokens(self, text: str) -> int | None:
        """Tokens in ``text`` by the server's own tokenizer, or None when no route answers."""
        routes: list[tuple[str, dict[str, Any]]] = [
            ("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}),
            ("/tokenize", {"content": text}),  # llama.cpp's llama-server
            ("/extras/tokenize", {"input": text}),  # llama-cpp-python
        ]
        for path, body in routes:
            try:
                response = self.http.post(f"{self.base_url}{path}", json=body)
            except httpx.HTTPError:
                continue
            if response.status_code != 200:
                continue
            try:
                data = response.json()
            except ValueError:
                continue
            if isinstance(data.get("count"), int):
                return int(data["count"])
            if isinstance(data.get("tokens"), list):
                return len(data["tokens"])
        return None
