"""The node programs' stand-ins for json, fnmatch, hashlib and typing.NamedTuple answer as the
standard library does (the standard library is the oracle here)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import random

import pytest

from sparkfleet.nodes.shipped.lean_stdlib import NamedRecord, glob_match, json_dumps, json_loads, sha256_hex
from sparkfleet.nodes.shipped.safetensors_index import TensorLoc, layer_of


def test_glob_match_agrees_with_fnmatch_on_random_names_and_patterns() -> None:
    rng = random.Random(3)
    alphabet = "ab.*?"
    for _ in range(20_000):
        name = "".join(rng.choice("ab.") for _ in range(rng.randrange(0, 9)))
        pattern = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 7)))
        assert glob_match(name, pattern) == fnmatch.fnmatchcase(name, pattern), (name, pattern)


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("model.layers.3.engram.embed.weight", "*.engram.embed.weight"),
        ("layers.3.engram.embed.weight", "*.engram.embed.weight"),
        ("layers.3.engram.embed.scale", "*.engram.embed.weight"),
        ("layers.3.Engram.embed.weight", "*.engram.embed.weight"),  # case counts, as in fnmatchcase
        ("layers.12.mlp.weight", "layers.1?.*"),
        ("layers.1.mlp.weight", "layers.[0-9].*"),  # a set: fnmatch itself answers
    ],
)
def test_glob_match_on_table_names(name: str, pattern: str) -> None:
    assert glob_match(name, pattern) == fnmatch.fnmatchcase(name, pattern)


@pytest.mark.parametrize(
    ("name", "layer"),
    [("model.layers.7.engram.embed.weight", 7), ("layers.12.x", 12), ("layers.3", None),
     ("xlayers.3.w", None), ("model.layers.x.w", None), ("a.layers.2b.layers.5.w", 5), ("embed.weight", None)],
)  # fmt: skip
def test_layer_of_reads_the_number_after_layers(name: str, layer: int | None) -> None:
    assert layer_of(name) == layer


@pytest.mark.parametrize(
    "value",
    [{"a": [1, 2.5, None, True, "é\n\"x\""], "b": {"c": -3}}, [], "text", 0, {"nested": [[{}]]}],
)
def test_json_round_trips_as_the_json_module_does(value: object) -> None:
    assert json_loads(json_dumps(value)) == value
    assert json_loads(json.dumps(value)) == json.loads(json.dumps(value))
    assert json.loads(json_dumps(value)) == value


def test_json_loads_takes_bytes_and_padding_and_refuses_what_json_refuses() -> None:
    assert json_loads(b'  {"k": 1}    ') == {"k": 1}  # safetensors pads its header with spaces
    for bad in ('{"k": 1} x', "", "{", "nope"):
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(ValueError):
            json_loads(bad)


def test_sha256_hex_is_sha256() -> None:
    data = bytes(range(256)) * 41
    assert sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_a_named_record_is_the_named_tuple_it_declares() -> None:
    class Point(NamedRecord):
        x: int
        y: int = 2

        @property
        def norm1(self) -> int:
            return abs(self.x) + abs(self.y)

    p = Point(3)
    assert (p, p.y, p.norm1, tuple(p), Point._fields) == (Point(3, 2), 2, 5, (3, 2), ("x", "y"))
    assert p._replace(x=-1) == (-1, 2)
    assert repr(p) == "Point(x=3, y=2)"
    with pytest.raises(AttributeError):
        p.z = 1  # type: ignore[attr-defined]
    loc = TensorLoc("t", "/s", "F8_E4M3", 10, 256, 4096)
    assert (loc.nbytes, loc.start, loc == ("t", "/s", "F8_E4M3", 10, 256, 4096)) == (2560, 4096, True)
