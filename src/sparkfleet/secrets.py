"""Which environment values are secrets, and how they are hidden in every rendering."""

from __future__ import annotations

import re
from collections.abc import Mapping

MASK = "***"
_SECRET = re.compile(r"(^HF_TOKEN$|^HUGGING_FACE_HUB_TOKEN$|_API_KEY$|_TOKEN$|_PASSWORD$|_SECRET$|^API_KEY$)")


def is_secret(key: str) -> bool:
    """True for names that hold credentials (HF_TOKEN, *_API_KEY, *_TOKEN, *_PASSWORD, *_SECRET)."""
    return bool(_SECRET.search(key.upper()))


def masked(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of env with secret values replaced by ``***``."""
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def redact(text: str, env: Mapping[str, str]) -> str:
    """Text with every secret value of env replaced by ``***`` (for log lines and errors)."""
    for key, value in env.items():
        if is_secret(key) and value and len(value) >= 4:
            text = text.replace(value, MASK)
    return text
