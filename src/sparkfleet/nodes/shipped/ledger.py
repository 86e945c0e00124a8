"""The ledger beside each staged file, ``<output>.ledger.json``, and the chunk hash it records
(node-side, stdlib only). Written after the data it describes, before the output's rename::

    format        "sparkfleet-staging-ledger/1"
    sources       [{path, real, size, mtime_ns, header_sha256}]  one per source shard used
    geometry      layout, tp, rank, layer, lo, hi, rows, row_bytes, tensors, size, chunks [[offset, length]]
    hash          "xxh3_64" (xxhash importable) or "blake2b-64" (standard library)
    chunk_hashes  one hex digest per geometry chunk (16 MiB of output by default)
    output        {size, mtime_ns, ino} of the output as written

The ledger vouches for the file at the output path only while ``output`` matches its stat.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

try:
    import xxhash
except ImportError:  # nodes without xxhash fall back to hashlib
    xxhash = None  # type: ignore[assignment]

LEDGER_FORMAT = "sparkfleet-staging-ledger/1"
LEDGER_SUFFIX = ".ledger.json"


def _blake2b_64() -> Any:
    import hashlib  # only where xxhash is missing: OpenSSL's load is a tenth of a re-stage

    return hashlib.blake2b(digest_size=8)


def hash_algorithms() -> dict[str, Callable[[], Any]]:
    """Constructors of the chunk hashes this node can compute (``update``/``hexdigest``), by name."""
    found: dict[str, Callable[[], Any]] = {"blake2b-64": _blake2b_64}
    if xxhash is not None:
        found["xxh3_64"] = xxhash.xxh3_64
    return found


def default_algorithm() -> str:
    return "xxh3_64" if xxhash is not None else "blake2b-64"


def ledger_path(output: str) -> str:
    return output + LEDGER_SUFFIX


def fsync(path: str) -> None:
    """Make a file's contents durable, or, for a folder, the renames inside it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str, obj: dict[str, Any]) -> None:
    """Write JSON to a temp file beside ``path`` and rename it into place. The caller makes it
    durable later (``fsync`` of the file, then of its folder): the rename is atomic for every
    process at once, and only a power cut before those fsyncs can lose it."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def read_ledger(output: str) -> dict[str, Any] | None:
    """The ledger for ``output``, or None when it is missing, unreadable or of another format."""
    try:
        with open(ledger_path(output), encoding="utf-8") as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != LEDGER_FORMAT:
        return None
    return data


def remove_ledger(output: str) -> None:
    try:
        os.unlink(ledger_path(output))
    except FileNotFoundError:
        return
