"""The two on-disk layouts of a rank's rows, ``packed`` and ``sparse-file`` (node-side, stdlib
only): chunks, how to build them from the source, and where each row lives in both.
"""

from __future__ import annotations

import os
import struct
import threading
from typing import Any, Literal

from sparkfleet.nodes.shipped.failure import StageFailure
from sparkfleet.nodes.shipped.safetensors_index import RowTable, ShardHeader, TensorLoc

_NUMPY: list[Any] = []  # [module or None] once looked up
_NUMPY_IMPORT: list[threading.Thread] = []

PACKED_MAGIC = 0x31344E4531565344  # "DSV41EN1"
PACKED_HEADER_BYTES = 4096
# I/O happens in blocks of about 1 MiB: measured on the test VM, 1 MiB reads+writes ran 2-3x
# faster than 16 MiB ones (buffers that stay in cache, smoother dirty-page write-back).
BLOCK_BYTES = 1 << 20


def owned_range(rows: int, rank: int, tp: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous rows of ``tp`` equal shares (SGLang/MiaAI ownership)."""
    return rows * rank // tp, rows * (rank + 1) // tp


def read_exact(fd: int, buf: Any, offset: int) -> None:
    """Fill ``buf`` from ``fd`` at ``offset``; StageFailure on a short file."""
    view = memoryview(buf)
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise StageFailure(f"unexpected end of file at offset {offset + done}")
        done += n


def interleave(out: Any, parts: list[tuple[Any, int]], rows: int) -> None:
    """Write ``rows`` records into ``out``: each record is every part's row, in order."""
    record = sum(width for _, width in parts)
    # Whole 8-byte words when every width allows (256 + 8 B rows): a third fewer cycles than
    # byte columns with numpy, an eighth of the strided copies without.
    size = 8 if all(width % 8 == 0 for _, width in parts) else 1
    np = _numpy()
    if np is not None:
        unit = np.uint64 if size == 8 else np.uint8
        view = np.frombuffer(out, dtype=unit, count=rows * record // size).reshape(rows, record // size)
        col = 0
        for data, width in parts:
            src = np.frombuffer(data, dtype=unit, count=rows * width // size).reshape(rows, width // size)
            view[:, col : col + width // size] = src
            col += width // size
        return
    # One strided copy per word column: ~15x slower than numpy, 8x faster than byte columns.
    fmt: Literal["Q", "B"] = "Q" if size == 8 else "B"
    dest = memoryview(out)[: rows * record].cast(fmt)
    step = record // size
    col = 0
    for data, width in parts:
        words = width // size
        src = memoryview(data)[: rows * width].cast(fmt)
        for j in range(words):
            dest[col + j :: step] = src[j::words]
        col += words


def _numpy() -> Any:
    """numpy if the node has it, else None (then interleave uses memoryview copies). Imported
    when a pack starts: a re-stage that only verifies never interleaves."""
    if _NUMPY_IMPORT:
        _NUMPY_IMPORT[0].join()
    if not _NUMPY:
        _import_numpy()
    return _NUMPY[0]


def _import_numpy() -> None:
    try:
        import numpy

        _NUMPY[:] = [numpy]
    except ImportError:
        _NUMPY[:] = [None]


def numpy_pending() -> bool:
    """True while the import started by ``import_numpy_in_background`` has not finished."""
    return bool(_NUMPY_IMPORT) and not _NUMPY


def import_numpy_in_background() -> None:
    """Start importing numpy in a thread (0.1-0.2 s with a cold cache, much of it reading its
    files): a pack's set-up and first reads go on meanwhile (see ``numpy_pending``), and the
    first ``interleave`` waits for it instead of doing it."""
    if not _NUMPY and not _NUMPY_IMPORT:
        _NUMPY_IMPORT.append(threading.Thread(target=_import_numpy, name="numpy-import", daemon=True))
        _NUMPY_IMPORT[0].start()


class Layout:
    """One output file of one rank: its chunks, how to build them, where its rows are."""

    path: str
    size: int
    chunks: list[tuple[int, int]]
    layout: str
    max_block = BLOCK_BYTES  # I/O block size (a whole number of records where records matter)

    def fixed_header(self) -> bytes:
        """Bytes at offset 0 that are not covered by chunks (compared exactly, not hashed)."""
        return b""

    def blocks(self, index: int) -> list[tuple[int, int]]:
        """Chunk ``index`` as ``(offset, length)`` I/O blocks of at most ``max_block`` bytes."""
        offset, length = self.chunks[index]
        step = self.max_block
        return [(o, min(offset + length, o + step) - o) for o in range(offset, offset + length, step)]

    def streams(self) -> dict[str, str]:
        """The source shard behind each sequential stream that ``build`` reads, by name. Each has a
        descriptor of its own: readahead state is per open file, and weight and scale rows read
        through one descriptor read at half the rate of two (readahead saw random reads)."""
        raise NotImplementedError

    def build(self, offset: int, length: int, out: bytearray, fds: dict[str, int]) -> memoryview:
        """The expected bytes of the output at ``offset`` (a block), built from the source into
        ``out``; ``fds`` holds a descriptor per stream (``streams``)."""
        raise NotImplementedError

    def read_spans(self, offset: int, length: int) -> list[tuple[str, int, int]]:
        """``(stream, offset, length)`` of the source that ``build`` reads for that block."""
        raise NotImplementedError

    def row_in_output(self, table: int, row: int) -> tuple[int, int]:
        """``(offset, length)`` of a row of table ``table`` in the output."""
        raise NotImplementedError

    def row_parts(self, table: int, row: int) -> list[tuple[str, int, int]]:
        """``(shard, offset, length)`` pieces of the source that make up that row."""
        raise NotImplementedError

    def ranges(self) -> list[tuple[int, int]]:
        """``(lo, hi)`` per table, for sampling."""
        raise NotImplementedError

    def sources(self) -> list[str]:
        """Shard paths this output is built from."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Geometry recorded in the ledger; a ledger with other geometry does not apply."""
        raise NotImplementedError

    @property
    def data_bytes(self) -> int:
        """Bytes the output really holds (excluding holes)."""
        return len(self.fixed_header()) + sum(length for _, length in self.chunks)


class PackedLayout(Layout):
    """``engram-l{L}-r{rank}of{tp}.bin``: 4 KiB header, then interleaved weight+scale rows."""

    layout = "packed"

    def __init__(self, table: RowTable, tp: int, rank: int, dst: str, chunk_bytes: int) -> None:
        if table.scale is None or table.layer is None:
            what = "a .scale partner" if table.scale is None else "a layers.N. layer number"
            raise StageFailure(
                f"{table.weight.name} has no {what}; the packed layout needs both "
                '(use layout = "sparse-file" for other tables)'
            )
        self.table = table
        self.weight, self.scale, self.layer = table.weight, table.scale, table.layer
        self.tp, self.rank = tp, rank
        self.lo, self.hi = owned_range(self.weight.rows, rank, tp)
        self.row_bytes = self.weight.row_bytes + self.scale.row_bytes
        self.path = os.path.join(dst, f"engram-l{self.layer}-r{rank}of{tp}.bin")
        self.size = PACKED_HEADER_BYTES + (self.hi - self.lo) * self.row_bytes
        self.chunk_rows = max(1, chunk_bytes // self.row_bytes)
        self.chunks = [
            (PACKED_HEADER_BYTES + (r0 - self.lo) * self.row_bytes,
             (min(self.hi, r0 + self.chunk_rows) - r0) * self.row_bytes)
            for r0 in range(self.lo, self.hi, self.chunk_rows)
        ]  # fmt: skip
        self.block_rows = max(1, BLOCK_BYTES // self.row_bytes)
        self.max_block = self.block_rows * self.row_bytes
        self._scratch = threading.local()  # read buffers, a pair per lane packing this output

    def fixed_header(self) -> bytes:
        fields = struct.pack("<6Q", PACKED_MAGIC, self.layer, self.lo, self.hi, self.weight.rows, self.row_bytes)
        return fields + bytes(PACKED_HEADER_BYTES - len(fields))

    def streams(self) -> dict[str, str]:
        return {"weight": self.weight.shard, "scale": self.scale.shard}

    def build(self, offset: int, length: int, out: bytearray, fds: dict[str, int]) -> memoryview:
        n = length // self.row_bytes
        w, s = self.weight, self.scale
        bufs = getattr(self._scratch, "bufs", None)
        if bufs is None:
            bufs = (bytearray(self.block_rows * w.row_bytes), bytearray(self.block_rows * s.row_bytes))
            self._scratch.bufs = bufs
        views = []
        for buf, (stream, start, count) in zip(bufs, self.read_spans(offset, length), strict=True):
            views.append(memoryview(buf)[:count])
            read_exact(fds[stream], views[-1], start)
        interleave(out, [(views[0], w.row_bytes), (views[1], s.row_bytes)], n)
        return memoryview(out)[: n * self.row_bytes]

    def read_spans(self, offset: int, length: int) -> list[tuple[str, int, int]]:
        r0 = self.lo + (offset - PACKED_HEADER_BYTES) // self.row_bytes
        n = length // self.row_bytes
        w, s = self.weight, self.scale
        return [
            ("weight", w.start + r0 * w.row_bytes, n * w.row_bytes),
            ("scale", s.start + r0 * s.row_bytes, n * s.row_bytes),
        ]

    def ranges(self) -> list[tuple[int, int]]:
        return [(self.lo, self.hi)]

    def row_in_output(self, table: int, row: int) -> tuple[int, int]:
        return PACKED_HEADER_BYTES + (row - self.lo) * self.row_bytes, self.row_bytes

    def row_parts(self, table: int, row: int) -> list[tuple[str, int, int]]:
        w, s = self.weight, self.scale
        return [
            (w.shard, w.start + row * w.row_bytes, w.row_bytes),
            (s.shard, s.start + row * s.row_bytes, s.row_bytes),
        ]

    def sources(self) -> list[str]:
        return sorted({self.weight.shard, self.scale.shard})

    def describe(self) -> dict[str, Any]:
        return {
            "layout": self.layout, "layer": self.layer, "tp": self.tp, "rank": self.rank,
            "lo": self.lo, "hi": self.hi, "rows": self.weight.rows, "row_bytes": self.row_bytes,
            "tensors": [self.weight.name, self.scale.name], "size": self.size,
            "chunks": [list(c) for c in self.chunks],
        }  # fmt: skip


class SparseFileLayout(Layout):
    """A same-size copy of a source shard holding only this rank's rows of its tables."""

    layout = "sparse-file"

    def __init__(
        self, shard: ShardHeader, tensors: list[TensorLoc], tp: int, rank: int, dst: str, chunk_bytes: int
    ) -> None:
        self.shard = shard
        self.tensors = sorted(tensors, key=lambda t: t.start)
        self.tp, self.rank = tp, rank
        self.path = os.path.join(dst, os.path.basename(shard.path))
        self.size = shard.size
        self._ranges = [owned_range(t.rows, rank, tp) for t in self.tensors]
        # Chunk 0 is the shard's own header, so the output is a valid safetensors file.
        self.chunks = [(0, shard.data_start)]
        for t, (lo, hi) in zip(self.tensors, self._ranges, strict=True):
            step = max(1, chunk_bytes // t.row_bytes) * t.row_bytes
            begin, end = t.start + lo * t.row_bytes, t.start + hi * t.row_bytes
            self.chunks += [(off, min(end, off + step) - off) for off in range(begin, end, step)]

    def streams(self) -> dict[str, str]:
        return {"rows": self.shard.path}

    def build(self, offset: int, length: int, out: bytearray, fds: dict[str, int]) -> memoryview:
        view = memoryview(out)[:length]
        read_exact(fds["rows"], view, offset)
        return view

    def read_spans(self, offset: int, length: int) -> list[tuple[str, int, int]]:
        return [("rows", offset, length)]

    def ranges(self) -> list[tuple[int, int]]:
        return list(self._ranges)

    def row_in_output(self, table: int, row: int) -> tuple[int, int]:
        t = self.tensors[table]
        return t.start + row * t.row_bytes, t.row_bytes

    def row_parts(self, table: int, row: int) -> list[tuple[str, int, int]]:
        offset, length = self.row_in_output(table, row)
        return [(self.shard.path, offset, length)]

    def sources(self) -> list[str]:
        return [self.shard.path]

    def describe(self) -> dict[str, Any]:
        return {
            "layout": self.layout, "tp": self.tp, "rank": self.rank, "size": self.size,
            "tensors": [t.name for t in self.tensors], "ranges": [list(r) for r in self._ranges],
            "chunks": [list(c) for c in self.chunks],
        }  # fmt: skip


def layouts_for(
    layout: str, tables: list[RowTable], headers: dict[str, ShardHeader],
    tp: int, rank: int, dst: str, chunk_bytes: int,
) -> list[Layout]:  # fmt: skip
    """The output files of one rank for the matched tables."""
    if not 0 <= rank < tp:
        raise StageFailure(f"rank {rank} is outside tensor parallel size {tp}")
    outputs: list[Layout] = []
    if layout == "packed":
        outputs = [PackedLayout(t, tp, rank, dst, chunk_bytes) for t in tables]
    elif layout == "sparse-file":
        by_shard: dict[str, list[TensorLoc]] = {}
        for t in tables:
            for loc in (t.weight, t.scale):
                if loc is not None:
                    by_shard.setdefault(loc.shard, []).append(loc)
        outputs = [
            SparseFileLayout(headers[s], locs, tp, rank, dst, chunk_bytes) for s, locs in sorted(by_shard.items())
        ]
    else:
        raise StageFailure(f'unknown staging layout "{layout}" (expected "packed" or "sparse-file")')
    names = [o.path for o in outputs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise StageFailure(f"several tables would be staged to the same file: {', '.join(dupes)}")
    return outputs
