"""``[variants.NAME]``: named overlays of a recipe, each a small change to the recipe as written.

A variant changes env keys (``[variants.NAME.env]`` sets them, ``env_unset`` removes them), args
by flag name (``args_set`` replaces a flag and its values where it stands, or appends it;
``args_add`` appends even when the flag is there, for repeatable flags; ``args_remove`` drops a
flag with its values), and simple top-level fields (image, parallel sizes, ports, shm, …).
``extends = "OTHER"`` applies OTHER first (chains); the recipe without any overlay is the variant
``base``, which every chain ends in.

The overlay works on the recipe's TOML data before validation, so the result is validated as a
whole recipe and ``plan()`` never sees a variant: it gets a plain Recipe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sparkfleet.config.validation import did_you_mean
from sparkfleet.errors import RecipeError
from sparkfleet.plan.flags import flag_groups, group_flag, is_flag, normal, without

BASE = "base"
# Top-level recipe fields a variant may replace outright. Their types and limits are the
# recipe's own: the overlaid data is validated as a recipe, errors pointed back at the variant.
SIMPLE_FIELDS = (
    "docker_image", "docker_image_dir", "port", "rendezvous_port", "required_nodes",
    "tensor_parallel_size", "pipeline_parallel_size", "distributed_backend", "shm_size",
    "served_model_name", "model", "model_file", "revision", "entrypoint",
)  # fmt: skip


class Variant(BaseModel):
    """One ``[variants.NAME]`` table as written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    extends: str = BASE
    description: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    env_unset: tuple[str, ...] = ()
    args_set: tuple[str, ...] = ()
    args_add: tuple[str, ...] = ()
    args_remove: tuple[str, ...] = ()
    docker_image: str | None = None
    docker_image_dir: str | None = None
    port: int | None = None
    rendezvous_port: int | None = None
    required_nodes: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    distributed_backend: str | None = None
    shm_size: str | None = None
    served_model_name: str | None = None
    model: str | None = None
    model_file: str | None = None
    revision: str | None = None
    entrypoint: tuple[str, ...] | None = None


def variant_names(data: Mapping[str, Any]) -> list[str]:
    """``base`` and every variant the recipe data defines, in file order."""
    table = data.get("variants")
    return [BASE, *(table.keys() if isinstance(table, dict) else ())]


def chain(data: Mapping[str, Any], name: str, source: str) -> list[str]:
    """The variants to apply for ``name``, root first (``base`` itself is not in the list)."""
    table: dict[str, Any] = data.get("variants") or {}
    known = variant_names(data)
    if name not in known:
        raise RecipeError(f"{source}: no variant {name!r}{did_you_mean(name, known)}; it has: {', '.join(known)}")
    order: list[str] = []
    current = name
    while current != BASE:
        if current in order:
            loop = " → ".join([*order[order.index(current) :], current])
            raise RecipeError(f"{source}: variants.{order[-1]}.extends: the chain is a loop ({loop})")
        order.append(current)
        parent = table[current].get("extends", BASE)
        if parent not in known:
            raise RecipeError(
                f"{source}: variants.{current}.extends: no variant {parent!r}{did_you_mean(str(parent), known)}"
                f" (known: {', '.join(known)})"
            )
        current = parent
    return order[::-1]


def _replace_flag(args: list[str], group: list[str]) -> list[str]:
    """args with every occurrence of group's flag replaced by group, where the first one stood."""
    flag = group_flag(group)
    out: list[list[str]] = []
    placed = False
    for existing in flag_groups(args):
        if flag is not None and group_flag(existing) == flag:
            if not placed:
                out.append(group)
                placed = True
            continue
        out.append(existing)
    if not placed:
        out.append(group)
    return [w for g in out for w in g]


def _overlay_args(args: list[str], spec: Mapping[str, Any], where: str) -> list[str]:
    for flag in spec.get("args_remove", ()):
        if not is_flag(flag):
            raise RecipeError(f"{where}.args_remove: {flag!r} is not a flag name (like --max-model-len)")
        present = [g[0].split("=", 1)[0] for g in flag_groups(args) if group_flag(g)]
        if normal(flag) not in {normal(p) for p in present}:
            raise RecipeError(
                f"{where}.args_remove: {flag} is not in the args it overlays{did_you_mean(flag, present)}"
            )
        args = without(args, (flag,))
    for key in ("args_set", "args_add"):
        words = list(spec.get(key, ()))
        if words and not is_flag(words[0]):
            raise RecipeError(f"{where}.{key}: must start with a flag (got {words[0]!r})")
        for group in flag_groups(words):
            args = _replace_flag(args, group) if key == "args_set" else [*args, *group]
    return args


def _overlay(data: dict[str, Any], spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    out = {k: v for k, v in data.items()}
    for key in SIMPLE_FIELDS:
        if key in spec:
            out[key] = spec[key]
    env = dict(out.get("env") or {})
    for key in spec.get("env_unset", ()):
        if key not in env:
            hint = did_you_mean(key, list(env))
            raise RecipeError(f"{where}.env_unset: {key!r} is not set by the env it overlays{hint}")
        del env[key]
    env.update(spec.get("env") or {})
    if env or "env" in out:
        out["env"] = env
    if any(k in spec for k in ("args_set", "args_add", "args_remove")):
        out["args"] = _overlay_args(list(out.get("args") or ()), spec, where)
    return out


def apply_variant(data: dict[str, Any], name: str, source: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Recipe data with variant ``name`` (and the chain it extends) applied.

    Returns the data and, for each simple field a variant set, the variant that set it last (so a
    bad value is reported at ``variants.NAME.key``). ``data`` must have passed validation as the
    base recipe, so every variant table is well-formed."""
    table: dict[str, Any] = data.get("variants") or {}
    set_by: dict[str, str] = {}
    for step in chain(data, name, source):
        spec = table[step]
        data = _overlay(data, spec, f"{source}: variants.{step}")
        set_by.update({k: step for k in SIMPLE_FIELDS if k in spec})
    return data, set_by
