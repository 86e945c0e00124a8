"""Secrets a recipe put in an engine's command line (``--api-key sk-…``, ``--hf-token hf_…``).

argv is the most public place on a machine: every user of the node sees it in ``ps``, and it is
in the plan, the stored plan and the exports. Where the engine reads the same setting from an
environment variable, the flag is taken out of argv and the value goes to the rank's private env
file under that name (masked like any secret env value). Where it does not, the value stays in
argv (the engine needs it) but is masked in every rendering and stored copy, and ``validate`` and
``plan`` say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sparkfleet.config.secrets import MASK, SECRET_FLAG, SECRET_VALUE

# The env vars each engine reads for a flag (vLLM's VLLM_API_KEY and huggingface_hub's HF_TOKEN;
# llama.cpp's llama-server reads LLAMA_API_KEY, llama-cpp-python's server API_KEY: both are set,
# so whichever server the recipe runs gets the key).
ENV_OF_FLAG: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {"--api-key": ("VLLM_API_KEY",), "--hf-token": ("HF_TOKEN",)},
    "llama-cpp": {"--api-key": ("LLAMA_API_KEY", "API_KEY"), "--api_key": ("LLAMA_API_KEY", "API_KEY")},
}


@dataclass(frozen=True)
class SecretArg:
    """A credential found in args: the flag that carried it (None: found by its shape), its
    value, and the env var it was moved to (None: it stays in argv, masked)."""

    flag: str | None
    value: str
    env: tuple[str, ...] = ()

    def describe(self) -> str:
        what = f"{self.flag} holds a secret" if self.flag else "an argument shaped like a token"
        if self.env:
            return f"args: {what}: passed as env {' and '.join(self.env)} instead (kept out of argv, ps and logs)"
        return (f"args: {what}: the engine reads it from argv only, so it shows in `ps` on the node; it is masked "
                "in plans, records and exports (better: an env var the engine reads, in [env] or --env)")  # fmt: skip


def split_secret_args(engine: str, args: Sequence[str]) -> tuple[tuple[str, ...], tuple[SecretArg, ...]]:
    """args without the secrets that move to env vars, and every secret found."""
    movable = ENV_OF_FLAG.get(engine, {})
    kept: list[str] = []
    found: list[SecretArg] = []
    i = 0
    while i < len(args):
        word = args[i]
        flag, eq, inline = word.partition("=")
        if word.startswith("-") and SECRET_FLAG.match(flag):
            has_next = i + 1 < len(args) and not args[i + 1].startswith("-")
            if eq or has_next:
                value = inline if eq else args[i + 1]
                env = movable.get(flag, ())
                found.append(SecretArg(flag, value, env))
                if env:
                    i += 1 if eq else 2
                    continue
                kept.append(word)
                if not eq:
                    kept.append(args[i + 1])
                i += 1 if eq else 2
                continue
        elif SECRET_VALUE.match(word):
            found.append(SecretArg(None, word))
        kept.append(word)
        i += 1
    return tuple(kept), tuple(found)


def mask_words(words: Iterable[str], secrets: Iterable[str]) -> tuple[str, ...]:
    """words with every secret value (a whole word, or after ``=``) replaced by the mask."""
    hidden = sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True)
    out = []
    for word in words:
        for secret in hidden:
            word = word.replace(secret, MASK)
        out.append(word)
    return tuple(out)
