"""Write synthetic safetensors checkpoints shaped like DeepSeek-V4.1-Flash's Engram shards.

Used by the staging tests and benchmarks/staging_throughput.py (and handy for trying ``sparkfleet
stage`` on a laptop):
real safetensors files, F8 tables written with a hand-made header because the ``safetensors``
package has no numpy dtype for F8_E4M3/F8_E8M0.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sparkfleet.nodes.shipped.safetensors_index import INDEX_NAME

_WRITE_BLOCK = 32 << 20


def write_shard(path: Path, tensors: Sequence[tuple[str, str, tuple[int, ...], int]], seed: int) -> None:
    """Write one shard of ``(name, dtype, shape, itemsize)`` tensors filled with seeded random bytes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, itemsize in tensors:
        nbytes = int(np.prod(shape)) * itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes with spaces
    rng = np.random.default_rng(seed)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for _name, _dtype, shape, itemsize in tensors:
            left = int(np.prod(shape)) * itemsize
            while left:
                n = min(left, _WRITE_BLOCK)
                fh.write(rng.bytes(n))
                left -= n


def write_engram_checkpoint(
    snapshot: Path, layers: dict[int, int], *, seed: int = 0, prefix: str = "", width: int = 256
) -> dict[int, Path]:
    """A snapshot directory: one shard per engram layer (weight [N,width] F8_E4M3 + scale [N,8]
    F8_E8M0 + a small BF16 tensor), a shard of other tensors, and the index. Returns layer→shard."""
    snapshot.mkdir(parents=True, exist_ok=True)
    total = len(layers) + 1
    weight_map: dict[str, str] = {}
    shards: dict[int, Path] = {}
    first = f"model-00001-of-{total:05d}.safetensors"
    other = [
        (f"{prefix}embed_tokens.weight", "BF16", (1024, 64), 2),
        (f"{prefix}norm.weight", "F32", (64,), 4),
    ]
    write_shard(snapshot / first, other, seed)
    weight_map.update({t[0]: first for t in other})
    for i, (layer, rows) in enumerate(sorted(layers.items()), start=2):
        name = f"model-{i:05d}-of-{total:05d}.safetensors"
        base = f"{prefix}layers.{layer}.engram"
        tensors = [
            (f"{base}.wkv.weight", "BF16", (64, 32), 2),
            (f"{base}.embed.scale", "F8_E8M0", (rows, 8), 1),
            (f"{base}.embed.weight", "F8_E4M3", (rows, width), 1),
        ]
        write_shard(snapshot / name, tensors, seed + i)
        weight_map.update({t[0]: name for t in tensors})
        shards[layer] = snapshot / name
    (snapshot / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return shards
