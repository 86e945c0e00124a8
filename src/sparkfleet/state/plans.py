"""The Plan as the state store keeps it, so ``watch`` can bring a deployment up again from the
same Plan (not from a recipe file that may have changed since).

The Plan is frozen dataclasses all the way down (plus the pydantic ``Node``); it is stored as
JSON with every secret env value replaced by the mask, and any secret value that strayed
elsewhere (an argv word) redacted too. Secrets come back from the node: each rank's private env
file, which ``up`` wrote and ``down`` leaves in place, holds the real values (``with_secrets``).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from sparkfleet.config.secrets import MASK, redact, secrets_of
from sparkfleet.errors import StateError
from sparkfleet.plan.model import EnvVar, Plan, RankPlan
from sparkfleet.plan.staging import BY_KIND, Entry, StagingStep, entry_from


def _encode(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    return value


def _decode(kind: Any, data: Any) -> Any:
    """data (from JSON) as an instance of the annotated type kind."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None:
            return None
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        return _decode(options[0], data) if len(options) == 1 else data
    if origin is tuple:
        args = typing.get_args(kind)
        inner = args[0] if args else Any
        return tuple(_decode(inner, v) for v in data)
    if origin is typing.Literal or kind is Any:
        return data
    if isinstance(kind, type) and issubclass(kind, Entry):
        return entry_from(data)  # a staging entry of the kind it names
    if kind is StagingStep and "entry" not in data:
        data = _flat_step(data)
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return kind.model_validate(data)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        known = {f.name for f in dataclasses.fields(kind)}
        # A field a newer sparkfleet added is absent from an older record: its default applies.
        return kind(**{k: _decode(hints[k], v) for k, v in data.items() if k in known})
    return data


def _flat_step(data: dict[str, Any]) -> dict[str, Any]:
    """A staging step as sparkfleet stored it before its kinds were a registry: flat, the kind's
    keys under ``spec`` (or beside the others, for a composed step)."""
    fields = BY_KIND[data["kind"]].model_fields
    entry = {k: v for k, v in {**data, **(data.get("spec") or {})}.items() if k in fields}
    return {"entry": entry, "rank": data["rank"], "node": data["node"], "tp": data.get("tp", 1)}


def plan_to_json(plan: Plan) -> str:
    """The Plan as stored: secret env values masked, stray copies of them redacted."""
    secrets = secrets_of((v.key, v.value) for r in plan.ranks for v in r.env)
    # Credentials the engine reads from argv only: named as secrets so redact hides them too.
    secrets.update({f"ARGV_{i}_SECRET": w for i, w in enumerate(w for r in plan.ranks for w in r.secret_words)})
    data = _encode(plan)
    for rank in data["ranks"]:
        rank["env"] = [{**v, "value": MASK} if EnvVar(v["key"], "", v["source"]).secret else v for v in rank["env"]]
    return redact(json.dumps(data), secrets)


def plan_from_json(text: str) -> Plan:
    """The stored Plan (secret env values still masked; see with_secrets)."""
    try:
        plan = _decode(Plan, json.loads(text))
    except (ValueError, TypeError, KeyError) as exc:
        raise StateError(f"the stored plan cannot be read ({exc}); bring the deployment up again with `up`") from exc
    assert isinstance(plan, Plan)
    return plan


def masked_keys(rank: RankPlan) -> list[str]:
    """The env keys of rank whose values the store did not keep."""
    return [v.key for v in rank.env if v.secret and v.value == MASK]


def with_secrets(plan: Plan, env_files: Mapping[int, Mapping[str, str] | None]) -> Plan:
    """plan with each rank's masked env values taken from that rank's env file as read from its
    node (rank -> KEY=VALUE pairs, None when the file is gone). A value the file lacks is an
    error naming the rank, node and key: a restart must not start a rank without its token."""
    ranks = []
    for rank in plan.ranks:
        missing = masked_keys(rank)
        if not missing:
            ranks.append(rank)
            continue
        found = env_files.get(rank.rank)
        absent = [k for k in missing if found is None or k not in found]
        if absent:
            where = "is gone" if found is None else f"lacks {', '.join(absent)}"
            raise StateError(f"{plan.name}: cannot start rank {rank.rank} on {rank.node.name} again: its env file "
                             f"{rank.env_file} {where}, and secrets are never stored; run `sparkfleet up` "
                             "with them set")  # fmt: skip
        assert found is not None
        env = tuple(dataclasses.replace(v, value=found[v.key]) if v.key in missing else v for v in rank.env)
        ranks.append(dataclasses.replace(rank, env=env))
    return dataclasses.replace(plan, ranks=tuple(ranks))
