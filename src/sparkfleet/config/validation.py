"""Turn pydantic validation errors into one user-facing line: file, key path, what is wrong."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Any, get_origin

from pydantic import BaseModel, ValidationError

from sparkfleet.config.secrets import MASK, argv_secrets, is_secret

_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")


def key_path(loc: Sequence[int | str]) -> str:
    """``("staging", 0, "min_free")`` → ``staging[0].min_free``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _members(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's annotation may hold (through tuples, unions, Annotated and dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) or () for m in _members(arg)]


def _tag(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("kind")
    return field.default if field is not None else None


def _walk(root: type[BaseModel], loc: Sequence[int | str]) -> tuple[tuple[int | str, ...], type[BaseModel] | None]:
    """loc without the tags pydantic adds inside a union told apart by ``kind`` (``staging[0].sync.src``
    is ``staging[0].src``), and the model that owns its last key, for 'did you mean'."""
    shown: list[int | str] = []
    models: list[type[BaseModel]] = [root]
    owners: list[type[BaseModel]] = []
    keyed = False  # the previous part was a field holding a table of models (``variants.NAME``)
    for part in loc:
        tagged = [m for m in models if isinstance(part, str) and _tag(m) == part]
        if tagged:
            models = tagged
            continue
        shown.append(part)
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        owners = models
        field = next((m.model_fields[part] for m in models if part in m.model_fields), None)
        keyed = field is not None and get_origin(field.annotation) is dict
        models = _members(field.annotation) if field is not None else []
    return tuple(shown), owners[0] if len(owners) == 1 else None


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _under_secret(loc: Sequence[int | str]) -> bool:
    return any(isinstance(part, str) and is_secret(part) for part in loc)


def masked_secrets(value: Any) -> Any:
    """value with whatever a secret-named key holds replaced by ``***``: a mistyped ``[env]`` table
    or list still carries the token, and an error message ends up in terminals and CI logs."""
    if isinstance(value, dict):
        return {k: (MASK if isinstance(k, str) and is_secret(k) else masked_secrets(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        hidden = set(argv_secrets(value))  # an args list with `--api-key K` or a token-shaped word
        return type(value)(MASK if isinstance(v, str) and v in hidden else masked_secrets(v) for v in value)
    if isinstance(value, str):
        match = _ASSIGNMENT.match(value)  # "HF_TOKEN=hf_…" written where a table was expected
        if match and is_secret(match.group(1)):
            return value[: match.end()] + MASK
    return value


def _got(err: Any, loc: Sequence[int | str]) -> str:
    """`` (got …)`` for a wrongly typed value, or nothing when the value belongs to a secret."""
    if _under_secret(loc):
        return ""
    return f" (got {masked_secrets(err.get('input'))!r})"


def shown_error(exc: ValidationError) -> Any:
    """The one error of several that describe() reports."""
    errors = exc.errors(include_url=False)
    # A misspelt key also makes the real key "missing": the typo is the error to show.
    return next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])


def describe(exc: ValidationError, root: type[BaseModel]) -> str:
    """The first validation error as ``key.path: message``."""
    err = shown_error(exc)
    loc, owner = _walk(root, tuple(err["loc"]))
    path = key_path(loc)
    kind = err["type"]
    if kind == "extra_forbidden":
        hint = did_you_mean(str(loc[-1]), list(owner.model_fields)) if owner else ""
        return f"{path}: unknown key{hint}"
    if kind in ("missing", "union_tag_not_found"):
        return f"{path}{'.kind' if kind != 'missing' else ''}: required key is missing"
    if kind == "union_tag_invalid":
        tag, expected = err["ctx"]["tag"], err["ctx"]["expected_tags"]
        choices = [c.strip().strip("'") for c in str(expected).split(",")]
        return f"{path}.kind: {tag!r} is not one of {expected}{did_you_mean(str(tag), choices)}"
    if kind == "literal_error" and not _under_secret(loc):
        expected = err.get("ctx", {}).get("expected", "")
        value = err.get("input")
        choices = [c.strip().strip("'") for c in str(expected).replace(" or ", ",").split(",")]
        hint = did_you_mean(str(value), choices) if isinstance(value, str) else ""
        return f"{path}: {value!r} is not one of {expected}{hint}"
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    value = err.get("input")
    if _under_secret(loc) and isinstance(value, str) and value and value in msg:
        msg = msg.replace(value, MASK)  # a validator that quotes its input
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"{path}: {msg.lower()}{_got(err, loc)}"
    return f"{path}: {msg}"
