"""Whether a model can be asked through ``/v1/chat/completions``: a base model whose tokenizer
carries no chat template cannot, and the engines say so differently.

- vLLM and SGLang refuse the request with HTTP 400 (vLLM: "As of transformers v4.44, default chat
  template is no longer allowed, …"; SGLang: transformers' "Cannot use chat template functions
  because tokenizer.chat_template is not set …").
- llama.cpp's llama-server answers: it frames the messages in its own ChatML fallback, which the
  model never saw; its ``GET /props`` then shows that fallback as ``chat_template``.

Either way the user gets one line naming ``--api completions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HINT = "a base model without a chat template: use --api completions"

# llama.cpp's CHATML_TEMPLATE_SRC (common/chat.cpp), used when the GGUF has no template.
LLAMA_CPP_CHATML_FALLBACK = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)


def refuses_chat(error: str | None) -> bool:
    """Whether a request's error is the engine refusing chat for want of a chat template."""
    if not error or not error.startswith("HTTP 4"):
        return False
    text = error.lower()
    return "chat template" in text or "chat_template" in text


def has_own_template(props: Mapping[str, Any] | None) -> bool | None:
    """From llama-server's ``GET /props``: False when chat is framed in llama.cpp's ChatML fallback
    for a model whose own tokens are not ChatML's (the GGUF has no template); None when unknown."""
    if not isinstance(props, Mapping) or not isinstance(props.get("chat_template"), str):
        return None
    template = "".join(str(props["chat_template"]).split())
    if template != "".join(LLAMA_CPP_CHATML_FALLBACK.split()):
        return True
    # A model of ChatML's own (its end token is <|im_end|>) may well have been trained on it.
    eos = props.get("eos_token")
    return None if eos is None else str(eos) == "<|im_end|>"


def no_template_line(model: str, engine: str) -> str:
    """The warning for a server that answers chat for a model without a template of its own."""
    return (f"{model} has no chat template of its own ({engine} frames chat messages in its ChatML fallback): "
            f"{HINT}")  # fmt: skip
