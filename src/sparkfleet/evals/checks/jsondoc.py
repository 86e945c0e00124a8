"""JSON tasks: the answer parses, then each rule holds at its path.

A rule is a table with ``path`` (dot-separated keys and list indexes; "" is the document) and
one or more of: ``keys`` (exact key set), ``type`` (object/array/string/int/number/bool/null),
``equals``, ``min``/``max`` (numbers), ``len`` (strings, arrays, objects), ``sorted``
(an array in ascending order), ``matches`` (a regex the whole string matches).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sparkfleet.evals.extract import extract_json
from sparkfleet.evals.verdict import Verdict

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_RULE_KEYS = {"path", "keys", "type", "equals", "min", "max", "len", "sorted", "matches"}
_MISSING = object()


def validate(spec: Mapping[str, Any]) -> None:
    """``rules``: a non-empty list of rule tables with known keys and types."""
    rules = spec.get("rules")
    if not isinstance(rules, list) or not rules:
        raise ValueError("json check needs 'rules', a non-empty list")
    for i, rule in enumerate(rules):
        if not isinstance(rule, Mapping) or "path" not in rule:
            raise ValueError(f"rule {i + 1} needs a 'path'")
        unknown = set(rule) - _RULE_KEYS
        if unknown:
            raise ValueError(f"rule {i + 1}: unknown key(s) {', '.join(sorted(unknown))}")
        if "type" in rule and rule["type"] not in _TYPES:
            raise ValueError(f"rule {i + 1}: type must be one of {', '.join(_TYPES)}")
        if len(rule) == 1:
            raise ValueError(f"rule {i + 1} checks nothing")


def _walk(doc: Any, path: str) -> Any:
    node = doc
    for part in [p for p in path.split(".") if p]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _same(a: Any, b: Any) -> bool:
    # JSON has one number type: 4 and 4.0 are the same value, True is not 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _check_rule(doc: Any, rule: Mapping[str, Any]) -> str | None:
    path = rule["path"]
    where = path or "the document"
    value = _walk(doc, path)
    if value is _MISSING:
        return f"{where} is missing"
    if "type" in rule and not _TYPES[rule["type"]](value):
        return f"{where} is {type(value).__name__}, expected {rule['type']}"
    if "keys" in rule:
        if not isinstance(value, dict):
            return f"{where} is not an object"
        if set(value) != set(rule["keys"]):
            return f"{where} has keys {sorted(value)}, expected {sorted(rule['keys'])}"
    if "equals" in rule and not _same(value, rule["equals"]):
        return f"{where} is {value!r}, expected {rule['equals']!r}"
    for bound in ("min", "max"):
        if bound in rule:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"{where} is not a number"
            if (bound == "min" and value < rule[bound]) or (bound == "max" and value > rule[bound]):
                return f"{where} = {value} is outside the allowed range"
    if "len" in rule:
        if not isinstance(value, str | list | dict):
            return f"{where} has no length"
        if len(value) != rule["len"]:
            return f"{where} has length {len(value)}, expected {rule['len']}"
    if rule.get("sorted"):
        if not isinstance(value, list):
            return f"{where} is not an array"
        try:
            if value != sorted(value):
                return f"{where} is not sorted"
        except TypeError:
            return f"{where} mixes types"
    if "matches" in rule and not (isinstance(value, str) and re.fullmatch(rule["matches"], value)):
        return f"{where} = {value!r} does not match {rule['matches']}"
    return None


def score(spec: Mapping[str, Any], answer: str) -> Verdict:
    """Parse the JSON, then every rule must hold; the first broken rule is the reason."""
    try:
        doc = extract_json(answer)
    except ValueError as exc:
        return Verdict.fail(str(exc))
    for rule in spec["rules"]:
        problem = _check_rule(doc, rule)
        if problem:
            return Verdict.fail(problem)
    return Verdict.ok(f"{len(spec['rules'])} rules hold")
