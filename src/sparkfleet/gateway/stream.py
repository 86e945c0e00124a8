"""Reading an engine's SSE answer as far as policy needs: the text deltas (for the loop detector),
usage and finish reason (for the request log); bytes go on to the client unchanged.

``Watch.feed(data)`` takes whole events (the caller cuts at the last blank line) and returns the
bytes to forward: the same object when nothing was dropped, so the common case copies nothing.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from sparkfleet.gateway.config import LoopAbort
from sparkfleet.gateway.loop import LoopDetector

_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_ESCAPE = re.compile(rb'[\x00-\x1f"\\]')  # what ends a JSON string or must be escaped in one
_TEXT = {True: re.compile(rb'"content"\s*:\s*"'), False: re.compile(rb'"text"\s*:\s*"')}  # chat, completion
MARKER = "\n\n[sparkfleet gateway: answer stopped, it was repeating itself ({reason})]"


def last_event_end(buf: bytes) -> int:
    """Index just past the last complete SSE event in buf (0: none). Engines end events with
    "\\n\\n" (vLLM, SGLang) or "\\r\\n\\r\\n" (llama-cpp-python's sse-starlette)."""
    a = buf.rfind(b"\n\n")
    b = buf.rfind(b"\n\r\n")
    return max(a + 2 if a >= 0 else 0, b + 3 if b >= 0 else 0)


def _value(payload: bytes, at: int) -> int:
    """Where a key's value begins: past the colon and any spaces after the key ending at ``at``."""
    while payload[at : at + 1] in (b":", b" "):
        at += 1
    return at


def _shape(payload: bytes, obj: dict[str, Any], chat: bool) -> tuple[bytes, bytes, int] | None:
    """(bytes before the text, bytes after it, index) of an event whose only effect is its text:
    one choice, no finish reason, no usage, the text escape-free (so another event with the same
    bytes around another escape-free text parses to the same object but for that text)."""
    choices = obj.get("choices")
    if obj.get("usage") or not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if choice.get("finish_reason"):
        return None
    if chat:
        delta = choice.get("delta")
        if not isinstance(delta, dict) or delta.get("reasoning_content"):
            return None
        text = delta.get("content")
    else:
        text = choice.get("text")
    if not isinstance(text, str):
        return None
    found = _TEXT[chat].findall(payload)
    if len(found) != 1:
        return None
    start = payload.find(found[0]) + len(found[0])
    end = start + len(text.encode())
    if payload[start:end].decode("utf-8", "replace") != text or payload[end : end + 1] != b'"':
        return None
    return payload[:start], payload[end:], choice.get("index", 0)


@dataclass
class Watch:
    """One streamed answer as it passes through."""

    chat: bool
    loop: LoopAbort
    drop_usage: bool  # the client did not ask for usage; the gateway did, for its log
    detectors: dict[int, LoopDetector] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    pieces: int = 0  # content deltas seen: the completion tokens when the engine sends no usage
    aborted: str | None = None  # the loop detector's reason
    done: bool = False  # [DONE] seen
    template: dict[str, Any] = field(default_factory=dict)  # id/model/created of the answer, for the marker
    text: list[str] | None = None  # the answer's text when it is logged or assembled
    # The last parsed event's bytes before and after its text, and its choice's index, when that
    # event changed nothing but the text (see _like_last).
    _shape: tuple[bytes, bytes, int] | None = field(default=None, repr=False)

    def feed(self, data: bytes) -> bytes:
        """Take whole events; the bytes to forward (up to and including the event that made the
        answer a loop, then the marker, a stop and [DONE] in its place)."""
        if b"\r" in data:  # llama-cpp-python's sse-starlette ends lines with \r\n
            data = data.replace(b"\r\n", b"\n")
        out: list[bytes] | None = None  # set once an event is dropped: what is kept, in pieces
        start = 0
        for event in data.split(b"\n\n"):
            end = start + len(event) + 2
            if event.startswith(b"data:") and b"\n" not in event:  # one data line: every engine's case
                keep = self._event(event[5:].strip())
            else:
                keep = True
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        keep = self._event(line[5:].strip()) and keep
            if not keep:
                if out is None:
                    out = [data[:start]]
            elif out is not None:
                out.append(data[start:end])
            if self.aborted:
                return (data[:end] if out is None else b"".join(out)) + self.closing()
            start = end
        return data if out is None else b"".join(out)

    def _event(self, payload: bytes) -> bool:
        """Read one event's payload; False when it must not reach the client."""
        if not payload:
            return True
        if payload == b"[DONE]":
            self.done = True
            return True
        like = self._like_last(payload)
        if like is not None:
            if like[0]:
                self._piece(like[1], like[0])
            return True
        try:
            # The C scanner itself: json.loads' wrappers (encoding detection, whitespace checks)
            # cost three times the parse on a chunk this small.
            obj, _ = _scan(payload.decode(), 0)
        except (ValueError, StopIteration):
            return True
        if not isinstance(obj, dict):
            return True
        if not self.template and obj.get("id"):
            self.template = {k: obj[k] for k in ("id", "object", "created", "model") if k in obj}
        if obj.get("usage"):
            self.usage = obj["usage"]
        choices = obj.get("choices") or ()
        if not choices:
            return not (self.drop_usage and self.usage is not None and "usage" in obj)
        for choice in choices:
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            if self.chat:
                delta = choice.get("delta") or {}
                piece = delta.get("content") or delta.get("reasoning_content") or ""
            else:
                piece = choice.get("text") or ""
            if piece:
                self._piece(choice.get("index", 0), piece)
        self._shape = _shape(payload, obj, self.chat)
        return True

    def _like_last(self, payload: bytes) -> tuple[str, int] | None:
        """The text (and choice index) of an event that is the last parsed one but for its text (the same bytes before
        and after an escape-free string), read without parsing: every engine sends almost only
        such events, and parsing each was a quarter of the gateway's CPU at 64 streams. None for
        any other event, which is then parsed (tests/unit/test_gateway_stream.py holds the two
        readings equal)."""
        shape = self._shape
        if shape is None or not payload.startswith(shape[0]) or not payload.endswith(shape[1]):
            return None
        end = len(payload) - len(shape[1])
        if end < len(shape[0]):
            return None
        raw = payload[len(shape[0]) : end]
        if _ESCAPE.search(raw):
            return None
        try:
            return raw.decode(), shape[2]
        except UnicodeDecodeError:
            return None

    def _piece(self, index: int, piece: str) -> None:
        self.pieces += 1
        if self.text is not None:
            self.text.append(piece)
        if self.loop.enabled and not self.aborted:
            detector = self.detectors.get(index)
            if detector is None:
                detector = self.detectors[index] = LoopDetector(self.loop)
            reason = detector.feed(piece)
            if reason:
                self.aborted = reason
                self.finish_reason = "stop"

    def closing_events(self) -> list[dict[str, Any]]:
        """What ends an answer cut short by the loop detector: the marker and finish_reason "stop"
        for every choice, and usage when the client asked for it."""
        marker = MARKER.format(reason=self.aborted)
        base = {"id": self.template.get("id", "sparkfleet-gateway"), "created": self.template.get("created",
                int(time.time())), "model": self.template.get("model", "")}  # fmt: skip
        choices = []
        for index in sorted(self.detectors) or [0]:
            part = {"content": marker} if self.chat else None
            choice: dict[str, Any] = {"index": index, "finish_reason": "stop"}
            if self.chat:
                choice["delta"] = part
            else:
                choice["text"] = marker
            choices.append(choice)
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        events = [{**base, "object": kind, "choices": choices}]
        if not self.drop_usage:
            events.append({**base, "object": kind, "choices": [], "usage": self.final_usage()})
        return events

    def closing(self) -> bytes:
        return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in self.closing_events()) + (
            b"data: [DONE]\n\n")  # fmt: skip

    def final_usage(self) -> dict[str, Any]:
        """Usage as the engine reported it, or as counted here when it sent none (or was cut off)."""
        prompt = int((self.usage or {}).get("prompt_tokens") or 0)
        completion = self.pieces if self.aborted or not self.usage else int(self.usage.get("completion_tokens") or 0)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Assembler:
    """A non-streamed answer built from the streamed one the gateway asked the engine for."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.choices: dict[int, dict[str, Any]] = {}
        self.template: dict[str, Any] = {}

    def feed(self, data: bytes) -> None:
        for line in data.splitlines():
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            if not self.template and obj.get("id"):
                self.template = {k: obj[k] for k in ("id", "created", "model", "system_fingerprint") if k in obj}
            for choice in obj.get("choices") or ():
                self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        index = choice.get("index", 0)
        into = self.choices.setdefault(index, {"index": index, "parts": {}, "tools": {}, "finish_reason": None})
        if choice.get("finish_reason"):
            into["finish_reason"] = choice["finish_reason"]
        if not self.chat:
            into["parts"].setdefault("text", []).append(choice.get("text") or "")
            return
        delta = choice.get("delta") or {}
        for key in ("content", "reasoning_content", "refusal"):
            if delta.get(key):
                into["parts"].setdefault(key, []).append(delta[key])
        for call in delta.get("tool_calls") or ():
            blank = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            slot = into["tools"].setdefault(call.get("index", 0), blank)
            if call.get("id"):
                slot["id"] = call["id"]
            fn = call.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""

    def result(self, usage: dict[str, Any], extra_text: str | None, finish_override: str | None) -> dict[str, Any]:
        """The answer as the engine would have given it without streaming (extra_text: the loop
        marker, appended to every choice)."""
        choices = []
        for index in sorted(self.choices) or [0]:
            c = self.choices.get(index) or {"index": index, "parts": {}, "tools": {}, "finish_reason": None}
            finish = finish_override or c["finish_reason"]
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": "".join(c["parts"].get("content", []))}
                if extra_text:
                    message["content"] += extra_text
                for key in ("reasoning_content", "refusal"):
                    if key in c["parts"]:
                        message[key] = "".join(c["parts"][key])
                if c["tools"]:
                    message["tool_calls"] = [c["tools"][i] for i in sorted(c["tools"])]
                choices.append({"index": index, "message": message, "logprobs": None, "finish_reason": finish})
            else:
                text = "".join(c["parts"].get("text", [])) + (extra_text or "")
                choices.append({"index": index, "text": text, "logprobs": None, "finish_reason": finish})
        return {
            "id": self.template.get("id", "sparkfleet-gateway"),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.template.get("created", int(time.time())),
            "model": self.template.get("model", ""),
            "choices": choices,
            "usage": usage,
        }
