"""Which environment values are secrets, and how they are hidden in every rendering."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

MASK = "***"
_SECRET = re.compile(r"(^HF_TOKEN$|^HUGGING_FACE_HUB_TOKEN$|_API_KEY$|_TOKEN$|_PASSWORD$|_SECRET$|^API_KEY$)")


# The variables an engine reads its API key from (vLLM; llama.cpp's llama-server and
# llama-cpp-python's server; SGLang's). plan/secret_args.py moves a recipe's --api-key there.
ENGINE_KEY_ENV = ("VLLM_API_KEY", "LLAMA_API_KEY", "API_KEY", "SGLANG_API_KEY")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """An OpenAI client's headers for a key (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def is_secret(key: str) -> bool:
    """True for names that hold credentials (HF_TOKEN, *_API_KEY, *_TOKEN, *_PASSWORD, *_SECRET)."""
    return bool(_SECRET.search(key.upper()))


def masked(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of env with secret values replaced by ``***``."""
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


# Credentials an engine may print whatever its env is called: Hugging Face tokens and HTTP
# bearer tokens (an API key echoed in a request log).
TOKEN_PATTERNS = (r"\bhf_[A-Za-z0-9]{8,}", r"\bsk-[A-Za-z0-9_-]{16,}", r"(?<=Bearer )[A-Za-z0-9._~+/=-]{4,}")
_PATTERNS = tuple(re.compile(p) for p in TOKEN_PATTERNS)


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """Text with every secret value of env, and anything shaped like a token, replaced by ``***``
    (for log lines, errors and stored records)."""
    # Longest first, so a secret that contains another is hidden whole.
    for key, value in sorted((env or {}).items(), key=lambda kv: -len(kv[1])):
        if is_secret(key) and value and len(value) >= 4:
            text = text.replace(value, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(MASK, text)
    return text


def secrets_of(env: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The secret-named entries of (key, value) pairs."""
    return {k: v for k, v in env if is_secret(k)}


def env_file_secrets(text: str) -> dict[str, str]:
    """The secret entries of a ``KEY=VALUE`` env file (what a rank was started with)."""
    return secrets_of(tuple(line.split("=", 1)) for line in text.splitlines() if "=" in line)  # type: ignore[misc]


def split_secret_sets(sets: Iterable[str]) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """``--set`` items without ``env.KEY=VALUE`` for secret KEYs, and those as ``--env`` pairs:
    a token given either way is masked and never stored."""
    kept: list[str] = []
    env: list[tuple[str, str]] = []
    for item in sets:
        key, sep, value = item.partition("=")
        parts = key.strip().split(".")
        if sep and len(parts) == 2 and parts[0] == "env" and is_secret(parts[1]):
            env.append((parts[1], value))
        else:
            kept.append(item)
    return tuple(kept), tuple(env)


# Flags whose value is a credential: --api-key, --hf-token, --admin-api-key, --db-password, ...
SECRET_FLAG = re.compile(r"^--?(?:[a-z0-9]+[-_])*(?:api[-_]?key|token|password|passwd|secret)$", re.IGNORECASE)
# Values shaped like a credential whatever flag carries them: Hugging Face and OpenAI-style keys.
SECRET_VALUE = re.compile(r"^(?:hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_-]{16,})$")


def argv_secrets(words: Iterable[object]) -> list[str]:
    """The credentials in a command line: values of secret-named flags (``--api-key K`` or
    ``--api-key=K``) and words shaped like a token."""
    seq = [w for w in words if isinstance(w, str)]
    found = []
    for i, word in enumerate(seq):
        flag, eq, inline = word.partition("=")
        if word.startswith("-") and SECRET_FLAG.match(flag):
            if eq:
                found.append(inline)
            elif i + 1 < len(seq) and not seq[i + 1].startswith("-"):
                found.append(seq[i + 1])
        elif SECRET_VALUE.match(word):
            found.append(word)
    return [f for f in found if f]
