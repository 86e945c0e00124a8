"""Safetensors header reading, table discovery and row ownership (node-side staging code)."""

from __future__ import annotations

import ast
import itertools
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from sparkfleet.nodes.ship import STAGE_WORKER, program_text
from sparkfleet.nodes.shipped.failure import StageFailure
from sparkfleet.nodes.shipped.layouts import owned_range
from sparkfleet.nodes.shipped.safetensors_index import find_tables, layer_of, read_header
from tests.synthetic_checkpoint import write_engram_checkpoint, write_shard


def test_header_offsets_point_at_the_tensor_bytes(tmp_path: Path) -> None:
    shard = tmp_path / "one.safetensors"
    write_shard(shard, [("a", "F32", (3, 4), 4), ("b.embed.weight", "F8_E4M3", (10, 256), 1)], seed=1)
    raw = shard.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = read_header(str(shard))
    assert header.data_start == 8 + hlen
    assert header.size == len(raw)
    tables, _ = find_tables(str(shard), ["*.embed.weight"])
    (table,) = tables
    assert (table.weight.rows, table.weight.row_bytes) == (10, 256)
    assert table.scale is None and table.layer is None
    begin, end = json.loads(raw[8 : 8 + hlen])["b.embed.weight"]["data_offsets"]
    assert raw[table.weight.start : table.weight.start + 10 * 256] == raw[8 + hlen + begin : 8 + hlen + end]


def test_snapshot_tables_come_with_scale_partner_and_layer(tmp_path: Path) -> None:
    write_engram_checkpoint(tmp_path, {1: 1000, 14: 777}, prefix="model.")
    tables, headers = find_tables(str(tmp_path), ["*.engram.embed.weight"])
    assert [(t.layer, t.weight.rows, t.scale.rows if t.scale else None) for t in tables] == [
        (1, 1000, 1000),
        (14, 777, 777),
    ]
    # Only the shards holding a matched table are opened when the index says where they are.
    assert sorted(Path(p).name for p in headers) == [
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    ]


def test_layer_number_is_found_with_or_without_model_prefix() -> None:
    assert layer_of("layers.14.engram.embed.weight") == 14
    assert layer_of("model.layers.1.engram.embed.weight") == 1
    assert layer_of("model.embed_tokens.weight") is None


def test_no_matching_table_is_a_clear_failure(tmp_path: Path) -> None:
    write_engram_checkpoint(tmp_path, {1: 10})
    with pytest.raises(StageFailure, match=r"no tensor matching \['\*\.nothing'\]"):
        find_tables(str(tmp_path), ["*.nothing"])


def test_a_truncated_shard_is_refused(tmp_path: Path) -> None:
    shards = write_engram_checkpoint(tmp_path, {1: 1000})
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) - 100])
    with pytest.raises(StageFailure, match="extends past the end of the file"):
        find_tables(str(tmp_path), ["*.engram.embed.weight"])


def test_not_a_safetensors_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(StageFailure, match="not a safetensors file"):
        read_header(str(bad))


@pytest.mark.parametrize("rows,tp", [(384_006_168, 4), (384_016_682, 3), (10, 4), (7, 8)])
def test_row_ranges_cover_every_row_once(rows: int, tp: int) -> None:
    ranges = [owned_range(rows, r, tp) for r in range(tp)]
    assert ranges[0][0] == 0 and ranges[-1][1] == rows
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert ranges[1][0] == rows // tp


def test_the_shipped_worker_is_self_contained() -> None:
    source = program_text(STAGE_WORKER)
    tree = ast.parse(source)
    # Unconditional top-level imports are standard library only; numpy/xxhash are optional.
    plain = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = {(a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0] for n in plain for a in n.names}
    assert names <= sys.stdlib_module_names | {"__future__"}, names - sys.stdlib_module_names


def test_safetensors_package_reads_the_synthetic_checkpoint(tmp_path: Path) -> None:
    """The generator writes real safetensors: the reference library parses every shard (F8 included)."""
    safetensors = pytest.importorskip("safetensors")
    write_engram_checkpoint(tmp_path, {1: 100})
    with safetensors.safe_open(str(tmp_path / "model-00002-of-00002.safetensors"), "numpy") as fh:
        assert sorted(fh.keys()) == [
            "layers.1.engram.embed.scale",
            "layers.1.engram.embed.weight",
            "layers.1.engram.wkv.weight",
        ]
    with safetensors.safe_open(str(tmp_path / "model-00001-of-00002.safetensors"), "numpy") as fh:
        norm = fh.get_tensor("norm.weight")
    assert norm.dtype == np.float32 and norm.shape == (64,)
