"""sparkfleet's one safetensors header reader (node-side, stdlib only; the controller uses
``header_tensors`` / ``tensor_nbytes`` too), and the 2-D row tables to stage.

The format: an 8-byte little-endian header length, a JSON header mapping each tensor name to
``{dtype, shape, data_offsets}`` (relative to the end of the header), then the data.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import struct
from collections.abc import Mapping
from typing import NamedTuple

from sparkfleet.nodes.shipped.failure import StageFailure

INDEX_NAME = "model.safetensors.index.json"
# Real headers are a few MB at most; a larger length means the file is not safetensors.
_MAX_HEADER = 256 << 20
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F32": 4, "I32": 4, "U32": 4, "F64": 8, "I64": 8, "U64": 8,
}  # fmt: skip


# Named tuples, not dataclasses: importing dataclasses (inspect, ast, dis, ...) is a measurable
# part of a re-stage, which is mostly the worker's start-up.
class ShardHeader(NamedTuple):
    """One shard's parsed header: where its data starts and its tensors."""

    path: str
    size: int
    mtime_ns: int
    data_start: int
    header_hash: str
    tensors: dict[str, dict[str, object]]


class TensorLoc(NamedTuple):
    """Where one 2-D tensor's bytes lie in its shard."""

    name: str
    shard: str
    dtype: str
    rows: int
    row_bytes: int
    start: int  # absolute file offset of row 0


class RowTable(NamedTuple):
    """A table to stage: its weight tensor, the optional ``.scale`` partner, and its layer."""

    weight: TensorLoc
    scale: TensorLoc | None
    layer: int | None


def header_tensors(raw: bytes | str) -> dict[str, dict[str, object]]:
    """The tensor entries of a safetensors JSON header (``__metadata__`` left out); ValueError
    when it is not a JSON object."""
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"safetensors header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not a JSON object")
    return {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def tensor_nbytes(tensors: Mapping[str, Mapping[str, object]]) -> dict[str, int]:
    """Tensor name → bytes of data, from header entries' ``data_offsets``."""
    out: dict[str, int] = {}
    for name, entry in tensors.items():
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise ValueError(f"safetensors header: tensor {name} has no data_offsets [start, end]")
        out[name] = int(offsets[1]) - int(offsets[0])
    return out


def read_header(path: str) -> ShardHeader:
    """Parse one shard's header; StageFailure if the file is not a safetensors file."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            head = fh.read(8)
            if len(head) < 8:
                raise StageFailure(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (length,) = struct.unpack("<Q", head)
            if length > _MAX_HEADER or 8 + length > st.st_size:
                raise StageFailure(f"{path}: not a safetensors file (header length {length})")
            raw = fh.read(length)
    except OSError as exc:
        raise StageFailure(f"cannot read {path}: {exc.strerror}") from exc
    try:
        tensors = header_tensors(raw)
    except ValueError as exc:
        raise StageFailure(f"{path}: {exc}") from exc
    return ShardHeader(path, st.st_size, st.st_mtime_ns, 8 + length, hashlib.sha256(head + raw).hexdigest(), tensors)


def locate(header: ShardHeader, name: str) -> TensorLoc:
    """The location of a 2-D tensor in a parsed shard; StageFailure if it is not a usable table."""
    entry = header.tensors.get(name)
    if entry is None:
        raise StageFailure(f"{header.path}: has no tensor {name}")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    dtype = str(entry.get("dtype"))
    if not (isinstance(shape, list) and len(shape) == 2 and isinstance(offsets, list) and len(offsets) == 2):
        raise StageFailure(f"{header.path}: tensor {name} is not a 2-D table (shape {shape})")
    rows, cols = int(shape[0]), int(shape[1])
    begin, end = int(offsets[0]), int(offsets[1])
    if rows <= 0 or end <= begin or (end - begin) % rows:
        raise StageFailure(f"{header.path}: tensor {name} has inconsistent offsets {offsets} for {shape}")
    row_bytes = (end - begin) // rows
    width = _DTYPE_BYTES.get(dtype)
    if width is not None and row_bytes != cols * width:
        raise StageFailure(f"{header.path}: tensor {name} ({dtype} {shape}) spans {end - begin} bytes")
    if header.data_start + end > header.size:
        raise StageFailure(f"{header.path}: tensor {name} extends past the end of the file (truncated?)")
    return TensorLoc(name, header.path, dtype, rows, row_bytes, header.data_start + begin)


def shard_paths(src: str) -> tuple[list[str], dict[str, str] | None]:
    """The shard files of a source (a snapshot directory or one file) and its weight map if indexed."""
    if os.path.isfile(src):
        return [src], None
    if not os.path.isdir(src):
        raise StageFailure(f"source {src} does not exist")
    index = os.path.join(src, INDEX_NAME)
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as fh:
                weight_map = json.loads(fh.read())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StageFailure(f"{index}: cannot read the weight map ({exc})") from exc
        mapping = {str(k): os.path.join(src, str(v)) for k, v in weight_map.items()}
        return sorted(set(mapping.values())), mapping
    shards = sorted(os.path.join(src, n) for n in os.listdir(src) if n.endswith(".safetensors"))
    if not shards:
        raise StageFailure(f"source {src} holds no .safetensors files")
    return shards, None


def partner_name(weight: str) -> str | None:
    """``x.weight`` -> ``x.scale``; None for names without the ``.weight`` suffix."""
    return weight[: -len(".weight")] + ".scale" if weight.endswith(".weight") else None


def layer_of(name: str) -> int | None:
    """The layer number in ``[model.]layers.{L}.…``, or None."""
    parts = name.split(".")
    for i in range(len(parts) - 2):  # "layers.{L}" and a dot after it
        if parts[i] == "layers" and parts[i + 1].isdecimal():
            return int(parts[i + 1])
    return None


def find_tables(src: str, patterns: list[str]) -> tuple[list[RowTable], dict[str, ShardHeader]]:
    """The tables of ``src`` whose names match any glob in ``patterns``, with the headers read."""
    shards, weight_map = shard_paths(src)
    headers: dict[str, ShardHeader] = {}

    def header_of(path: str) -> ShardHeader:
        if path not in headers:
            headers[path] = read_header(path)
        return headers[path]

    owner = weight_map if weight_map is not None else {n: s for s in shards for n in header_of(s).tensors}
    names = sorted(n for n in owner if any(fnmatch.fnmatchcase(n, p) for p in patterns))
    if not names:
        raise StageFailure(f"source {src} has no tensor matching {patterns}")
    tables = []
    for name in names:
        weight, scale, pname = locate(header_of(owner[name]), name), None, partner_name(name)
        if pname is not None and pname in owner:
            scale = locate(header_of(owner[pname]), pname)
            if scale.rows != weight.rows:
                raise StageFailure(f"{name} has {weight.rows} rows but {pname} has {scale.rows}; they must match")
        tables.append(RowTable(weight, scale, layer_of(name)))
    return tables, headers
