"""Stage one rank's rows of large tables onto node-local disk (node-side entry point, bundled
into one script by ``bundle.py``; the last stdout line is a JSON result).

An output whose ledger matches the source identity, its own stat, its header, sampled rows
(against the source) and sampled chunk hashes is left alone. Anything else is (re)built in
``<output>.partial``, writing only chunks that differ, fsynced, given a fresh ledger and renamed
into place, so the final path only ever holds a file its ledger vouches for.
"""

from __future__ import annotations

import bisect
import fcntl
import functools
import itertools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from queue import Queue
from typing import Any, TypeVar

from sparkfleet.nodes.shipped.disk import allocated_bytes, check_room
from sparkfleet.nodes.shipped.failure import StageFailure, failure_result
from sparkfleet.nodes.shipped.layouts import (
    Layout,
    import_numpy_in_background,
    layouts_for,
    numpy_pending,
    read_exact,
)
from sparkfleet.nodes.shipped.ledger import (
    LEDGER_FORMAT,
    default_algorithm,
    fsync,
    hash_algorithms,
    ledger_path,
    read_ledger,
    remove_ledger,
    write_json_atomic,
)
from sparkfleet.nodes.shipped.safetensors_index import ShardHeader, find_tables

_T = TypeVar("_T")

DEFAULT_CHUNK_BYTES = 16 << 20
DEFAULT_SAMPLE_ROWS = 128
# Sampled rows come in runs of this many neighbours, one read of the output and of each source
# stream per run: rows picked one by one were three random reads each (1,560 for a 2 GiB table at
# tp=4, most of a cold re-stage), and damage here and there is found as often.
SAMPLE_RUN = 8
# A re-stage hashes one chunk in this many of a node's outputs (at least one), so its reads grow
# with the data, not the number of files (one per output was 3 % of a 2 GiB pack at tp=4);
# ``--verify`` hashes every chunk.
SAMPLE_SHARE = 256
PARTIAL_SUFFIX = ".partial"
RESULT_MARKER = "SPARKFLEET-STAGE-RESULT "
_PROGRESS_EVERY = 0.5
_FADV_OK = hasattr(os, "posix_fadvise")


class Progress:
    """Writes ``{"job", "done", "total", "output"}`` to a file the controller polls (atomically)."""

    def __init__(self, path: str | None, total: int, job: int) -> None:
        self.path, self.total, self.done, self.job = path, total, 0, job
        self.output = ""
        self._last = 0.0
        self._lock = threading.Lock()  # an output's lanes add to it at once

    def add(self, n: int, output: str = "") -> None:
        with self._lock:
            self.done += n
            self.output = output or self.output
            if self.path and time.monotonic() - self._last >= _PROGRESS_EVERY:
                self._write()

    def flush(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        if not self.path:
            return
        self._last = time.monotonic()
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"job": self.job, "done": self.done, "total": self.total, "output": self.output}))
        os.replace(tmp, self.path)


def _drop_cache(fd: int, offset: int, length: int) -> None:
    # On a DGX Spark the page cache competes with GPU memory; a pack must not fill it.
    if _FADV_OK:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


class _Finisher:
    """The disk side of one output, in its own thread: page-cache advice while it is packed,
    then fsync (once the output before it is synced), ledger, rename.

    A pack is bound by how fast the disk makes writes durable, so the fsyncs must follow each
    other without a gap: while output k is fsynced, k+1 is read and written. The ledger's and
    the folder's fsyncs wait for the stager's close (``later``): made while another output was
    being written, each waited 50-160 ms for that output's data in the same journal commit.
    A killed worker loses nothing; a power cut before the close at worst a ledger.
    """

    def __init__(self, fd: int, before: _Finisher | None) -> None:
        self.fd, self.before = fd, before
        self.failure: BaseException | None = None
        self.seconds = 0.0
        self.synced = threading.Event()
        self.later: list[str] = []  # files renamed into place whose fsync (and folder's) is left to the close
        self._calls: Queue[Callable[[], None] | None] = Queue()
        self._thread = threading.Thread(target=self._run, name="stage-finisher", daemon=True)
        self._thread.start()

    def advise(self, offset: int, length: int) -> None:
        self._calls.put(functools.partial(_drop_cache, self.fd, offset, length))

    def finish(self, sync: Callable[[], None], then: Callable[[], None]) -> None:
        """Run ``sync`` once the output before this one is synced, then ``then``; nothing after."""
        self._calls.put(functools.partial(self._finish, sync, then))
        self._calls.put(None)

    def abandon(self) -> None:
        """The pack failed: stop, and let the caller close the descriptor."""
        self._calls.put(None)
        self._thread.join()

    def join(self) -> BaseException | None:
        self._thread.join()
        return self.failure

    def _finish(self, sync: Callable[[], None], then: Callable[[], None]) -> None:
        if self.before is not None:
            self.before.synced.wait()
        t0 = time.monotonic()
        try:
            sync()
        finally:
            self.synced.set()
        then()
        self.seconds = time.monotonic() - t0

    def _run(self) -> None:
        try:
            while True:
                call = self._calls.get()
                if call is None:
                    return
                if self.failure is None:
                    try:
                        call()
                    except BaseException as exc:  # reported by the job that packed this output
                        self.failure = exc
        finally:
            self.synced.set()  # failed or abandoned: the next output need not wait for it


class _WriteBehind:
    """Starts write-back of each window of output as soon as it is written, and drops it and the
    source bytes it came from from the page cache once they are no longer needed.

    Left to the kernel, a pack dirties the whole output and the final fsync writes it all.
    POSIX_FADV_DONTNEED on dirty pages starts asynchronous write-back (WB_SYNC_NONE) and drops
    clean ones, so issuing it on each finished window lets the disk write while the next is
    read, and issuing it again ``_LAG`` windows later drops them: the page cache holds a few
    windows, not the pack, and the writer is never throttled for dirty memory. The output's
    advice goes through its ``_Finisher`` (starting write-back can wait on a busy disk).

    A window ends on a multiple of ``_ALIGN``: blocks are whole rows and end inside a page, and
    a window ending there wrote that page twice and split the write-back into requests the
    device could not merge (a fifth more write requests than ``cp`` on the test VM).
    """

    _WINDOW = 32 << 20
    _ALIGN = 4 << 20
    _LAG = 2

    def __init__(self, finisher: _Finisher, fds: dict[str, int]) -> None:
        self.finisher, self.fds = finisher, fds  # the source's, by stream (``Layout.streams``)
        self.lo = self.hi = 0
        self.started: list[tuple[int, int]] = []
        self.read: dict[str, list[list[int]]] = {}

    def block(self, offset: int, length: int, spans: list[tuple[str, int, int]]) -> None:
        """Block ``(offset, length)`` of the output is written, built from the source ``spans``."""
        if not _FADV_OK:
            return
        if self.hi != self.lo and offset != self.hi:
            self.flush(whole=True)  # the lane took a chunk further on: a window is one run of its writes
        if self.hi == self.lo:
            self.lo = offset
        self.hi = offset + length
        for stream, start, n in spans:
            runs = self.read.setdefault(stream, [])
            for run in runs:
                if run[1] == start:
                    run[1] = start + n
                    break
            else:
                runs.append([start, start + n])
        if self.hi - self.lo >= self._WINDOW:
            self.flush()

    def flush(self, whole: bool = False) -> None:
        end = self.hi if whole else self.hi - self.hi % self._ALIGN
        if end > self.lo:
            self.finisher.advise(self.lo, end - self.lo)
            self.started.append((self.lo, end))
            self.lo = end
        while len(self.started) > self._LAG:
            lo, hi = self.started.pop(0)
            self.finisher.advise(lo, hi - lo)
        for stream, runs in self.read.items():
            for lo, hi in runs:
                _drop_cache(self.fds[stream], lo, hi - lo)
        self.read.clear()


def _write_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def source_identity(out: Layout, headers: dict[str, ShardHeader]) -> list[dict[str, Any]]:
    """What the ledger remembers about each source shard of ``out``."""
    return [
        {
            "path": path, "real": os.path.realpath(path), "size": headers[path].size,
            "mtime_ns": headers[path].mtime_ns, "header_sha256": headers[path].header_hash,
        }
        for path in out.sources()
    ]  # fmt: skip


def output_stat(path: str) -> dict[str, int] | None:
    """The output's stat as the ledger records it; None when absent."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _usable_hashes(out: Layout, ledger: dict[str, Any] | None, ident: list[dict[str, Any]]) -> list[str] | None:
    """The ledger's chunk hashes if they describe this output built from this source."""
    if (
        ledger is None
        or ledger.get("geometry") != out.describe()
        or ledger.get("sources") != ident
        or ledger.get("hash") not in hash_algorithms()
    ):
        return None
    hashes = ledger.get("chunk_hashes")
    return hashes if isinstance(hashes, list) and len(hashes) == len(out.chunks) else None


def _sample_rows(out: Layout, rng: random.Random, count: int) -> list[tuple[int, int]]:
    """About ``count`` rows of each table, in runs of ``SAMPLE_RUN`` from random starts, and the
    table's first and last row."""
    picked: list[tuple[int, int]] = []
    for table, (lo, hi) in enumerate(out.ranges()):
        if hi <= lo:
            continue
        rows = {lo, hi - 1}
        for _ in range(max(1, min(count, hi - lo) // SAMPLE_RUN)):
            start = rng.randrange(lo, hi)
            rows.update(range(start, min(hi, start + SAMPLE_RUN)))
        picked += [(table, r) for r in sorted(rows)]
    return picked


class _Pieces:
    """Small pieces of open files, read in as few requests as they allow: pieces that touch or
    overlap are one read (a run of sampled rows is three: the output's, the weights', the scales')."""

    def __init__(self, pieces: list[tuple[int, int, int]]) -> None:
        self.runs: dict[int, list[list[int]]] = {}  # by descriptor: [start, end) of each read
        for fd, offset, length in sorted(pieces):
            runs = self.runs.setdefault(fd, [])
            if runs and offset <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], offset + length)
            else:
                runs.append([offset, offset + length])
        self.data: dict[int, list[bytes]] = {}

    def read(self) -> None:
        # Random reads: asked for all at once (WILLNEED starts the reads and returns) they queue
        # on the device together (NVMe does ~30x more IOPS at depth 64 than at depth 1) instead
        # of paying one latency each, without a thread pool to start.
        for fd, runs in self.runs.items():
            for start, end in runs if _FADV_OK else ():
                os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)
        for fd, runs in self.runs.items():
            self.data[fd] = [os.pread(fd, end - start, start) for start, end in runs]

    def get(self, fd: int, offset: int, length: int) -> bytes:
        runs = self.runs[fd]
        k = bisect.bisect_right(runs, [offset, float("inf")]) - 1
        start = runs[k][0]
        return self.data[fd][k][offset - start : offset - start + length]


def _chunk_hash(fd: int, out: Layout, index: int, buf: bytearray, new_hash: Any) -> str:
    """Hash chunk ``index`` of the file open as ``fd``, reading it block by block."""
    h = new_hash()
    for offset, length in out.blocks(index):
        view = memoryview(buf)[:length]
        read_exact(fd, view, offset)
        h.update(view)
    start, total = out.chunks[index]
    _drop_cache(fd, start, total)
    return str(h.hexdigest())


def chunk_picks(outs: list[Layout], rng: random.Random, full: bool) -> list[list[int]]:
    """Per output, the chunks to hash against its ledger: all of them with ``full``, else one in
    ``SAMPLE_SHARE`` of all these outputs' chunks taken together (at least one)."""
    if full:
        return [list(range(len(o.chunks))) for o in outs]
    every = [(k, i) for k, o in enumerate(outs) for i in range(len(o.chunks))]
    picks: list[list[int]] = [[] for _ in outs]
    for k, i in sorted(rng.sample(every, min(len(every), max(1, len(every) // SAMPLE_SHARE)))):
        picks[k].append(i)
    return picks


def assess(
    out: Layout, ident: list[dict[str, Any]], fds: dict[str, int], rng: random.Random,
    sample_rows: int, picks: list[int], against_source: bool = False,
) -> tuple[str, dict[str, Any] | None]:  # fmt: skip
    """``("ok", ledger)`` when the output is vouched for and checks out (its header, sampled rows
    against the source, the chunks ``picks`` against the ledger, or with ``against_source``
    rebuilt from the source byte for byte: ``stage --verify``), else the reason."""
    ledger = read_ledger(out.path)
    stat = output_stat(out.path)
    if stat is None:
        return "missing", ledger
    if ledger is None or ledger.get("geometry") != out.describe():
        return "unvouched", ledger
    if ledger.get("sources") != ident:
        return "source-changed", ledger
    hashes = _usable_hashes(out, ledger, ident)
    if hashes is None:
        return "unvouched", ledger
    if ledger.get("output") != stat:
        return "modified", ledger
    fd = os.open(out.path, os.O_RDONLY)
    try:
        header = out.fixed_header()
        if header and os.pread(fd, len(header), 0) != header:
            return "damaged", ledger

        points = _sample_rows(out, rng, sample_rows)
        pieces = _Pieces([(fd, *out.row_in_output(*point)) for point in points]
                         + [(fds[s], o, k) for point in points for s, o, k in out.row_parts(*point)])  # fmt: skip
        pieces.read()  # the sampled chunk is left to readahead, which read it faster than WILLNEED
        for point in points:
            expected = b"".join(pieces.get(fds[s], o, k) for s, o, k in out.row_parts(*point))
            if pieces.get(fd, *out.row_in_output(*point)) != expected:
                # Without the ledger: its hashes describe the output as built, and a source
                # rewritten in place (same size, mtime and header) would leave every chunk
                # "matching" them. The repair then builds each chunk from the source and compares.
                return "damaged", None
        buf = bytearray(out.max_block)
        if against_source:
            # Every row range against the source itself: a source rewritten in place with its
            # size, mtime and header kept matches the ledger, not these bytes.
            return ("ok", ledger) if _same_as_source(fd, out, picks, buf) else ("damaged", None)
        for i in picks:
            if _chunk_hash(fd, out, i, buf, hash_algorithms()[ledger["hash"]]) != hashes[i]:
                return "damaged", ledger
    finally:
        os.close(fd)
    return "ok", ledger


def _same_as_source(fd: int, out: Layout, picks: list[int], buf: bytearray) -> bool:
    """Whether chunks ``picks`` of the output hold exactly what ``build`` makes of the source."""
    streams = {name: os.open(path, os.O_RDONLY) for name, path in out.streams().items()}
    try:
        built = bytearray(out.max_block)
        for i in picks:
            for boff, blen in out.blocks(i):
                view = memoryview(buf)[:blen]
                read_exact(fd, view, boff)
                if view != out.build(boff, blen, built, streams):
                    return False
            _drop_cache(fd, *out.chunks[i])
    finally:
        for sfd in streams.values():
            os.close(sfd)
    return True


# An output is packed by this many threads at once, each through a contiguous run of its chunks
# with descriptors of its own. Reads, numpy, hashing and writes release the GIL, so one lane's CPU
# work overlaps the other's disk waits. At 2 GiB, tp=4: 1.0-1.13x one lane's rate on 2 cores, 88 %
# of cp's rate against 81 % on 16 cores; four lanes were no better than two.
_LANES = 2
_WARM_CHUNKS = 8  # per lane: 2 x 128 MiB is about what the disk reads while numpy is imported


class _ChunkRuns:
    """An output's chunk indices as one contiguous run per lane; a lane whose run is done takes
    the second half of the longest run left.

    Runs keep each lane's reads sequential (chunks handed out in turn packed 14 % slower, as
    readahead started over at every chunk); halving what is left keeps one lane from packing
    the end alone.
    """

    def __init__(self, n: int, lanes: int) -> None:
        self._runs = [[n * k // lanes, n * (k + 1) // lanes] for k in range(lanes)]
        self._lock = threading.Lock()

    def take(self, lane: int) -> int | None:
        with self._lock:
            run = self._runs[lane]
            if run[0] >= run[1]:
                other = max(self._runs, key=lambda r: r[1] - r[0])
                if other[1] - other[0] < 2:
                    return None  # at most one chunk left, which its own lane takes next
                middle = (other[0] + other[1]) // 2
                run[:] = [middle, other[1]]
                other[1] = middle
            run[0] += 1
            return run[0] - 1


class _Lane:
    """Packs the chunks of one output it takes from a ``_ChunkRuns`` (see ``_LANES``), with its
    own buffers and ``_WriteBehind``; a lane that fails sets ``stop``, so the others end at their
    next chunk."""

    def __init__(
        self, out: Layout, fd: int, finisher: _Finisher, progress: Progress,
        expected: list[str] | None, existed: bool, new_hash: Any, stop: threading.Event,
    ) -> None:  # fmt: skip
        self.out, self.fd, self.finisher, self.progress = out, fd, finisher, progress
        self.expected, self.existed, self.new_hash, self.stop = expected, existed, new_hash, stop
        self.hashes: dict[int, str] = {}
        self.written = self.rewritten = 0

    def run(self, chunks: Callable[[], int | None]) -> None:
        out = self.out
        built, current = bytearray(out.max_block), bytearray(out.max_block)
        fds: dict[str, int] = {}
        try:
            for stream, shard in out.streams().items():
                fds[stream] = os.open(shard, os.O_RDONLY)
                if _FADV_OK:
                    os.posix_fadvise(fds[stream], 0, 0, os.POSIX_FADV_SEQUENTIAL)
            self._pack(chunks, fds, built, current)
        except BaseException:
            self.stop.set()  # the other lanes give up at their next chunk
            raise
        finally:
            for stream_fd in fds.values():
                os.close(stream_fd)

    def _pack(
        self, chunks: Callable[[], int | None], fds: dict[str, int], built: bytearray, current: bytearray
    ) -> None:
        out, fd = self.out, self.fd
        behind = _WriteBehind(self.finisher, fds)
        for i in itertools.chain(self._warm(chunks, fds, built), iter(chunks, None)):
            if self.stop.is_set():
                return
            length = out.chunks[i][1]
            if self.expected is not None and _chunk_hash(fd, out, i, current, self.new_hash) == self.expected[i]:
                self.hashes[i] = self.expected[i]
                self.progress.add(length, out.path)
                continue
            h, touched = self.new_hash(), False
            for boff, blen in out.blocks(i):
                data = out.build(boff, blen, built, fds)
                h.update(data)
                if self.existed:
                    view = memoryview(current)[:blen]
                    read_exact(fd, view, boff)
                    same = view == data
                if not self.existed or not same:
                    _write_all(fd, data, boff)
                    self.written += blen
                    touched = True
                behind.block(boff, blen, out.read_spans(boff, blen))
            self.rewritten += touched
            self.hashes[i] = str(h.hexdigest())
            self.progress.add(length, out.path)
        behind.flush(whole=True)

    def _warm(self, chunks: Callable[[], int | None], fds: dict[str, int], scratch: bytearray) -> list[int]:
        """While numpy is still being imported, take chunks and read their source into the page
        cache, so the disk streams instead of waiting for the import (0.1-0.25 s with a cold
        cache, a tenth of a 2 GiB pack on the test VM); the chunks taken, to pack first."""
        taken: list[int] = []
        while numpy_pending() and len(taken) < _WARM_CHUNKS and not self.stop.is_set():
            i = chunks()
            if i is None:
                break
            taken.append(i)
            if self.expected is None:  # a repair reads the output first; leave its order alone
                for boff, blen in self.out.blocks(i):
                    for stream, start, n in self.out.read_spans(boff, blen):
                        read_exact(fds[stream], memoryview(scratch)[:n], start)
        return taken


def repack(
    out: Layout, ledger: dict[str, Any] | None, ident: list[dict[str, Any]], progress: Progress,
    stager: _Stager, job: int,
) -> dict[str, Any]:  # fmt: skip
    """Make ``out`` right, writing only blocks whose bytes differ; returns counts. The fsync,
    ledger and rename are left to the output's ``_Finisher`` (``stager.close()`` waits for them)."""
    hash_name = default_algorithm()
    expected = _usable_hashes(out, ledger, ident)
    if expected is not None and ledger is not None:
        hash_name = ledger["hash"]  # compare like with like, even if a faster hash exists now
    new_hash = hash_algorithms()[hash_name]
    final, partial = out.path, out.path + PARTIAL_SUFFIX
    # From here on the final path is absent until the new ledger is written: nothing unvouched
    # can be found there, whatever happens to this process.
    if os.path.exists(final):
        os.replace(final, partial)
    remove_ledger(final)
    existed = os.path.exists(partial)
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    written = rewritten = 0
    finisher = None
    try:
        if os.fstat(fd).st_size != out.size:
            os.ftruncate(fd, out.size)
        header = out.fixed_header()
        if header and (not existed or os.pread(fd, len(header), 0) != header):
            _write_all(fd, header, 0)
            written += len(header)
        finisher = stager.finisher(fd, job)
        stop = threading.Event()
        count = max(1, min(_LANES, len(out.chunks)))
        runs = _ChunkRuns(len(out.chunks), count)
        lanes = [
            _Lane(out, fd, finisher, progress, expected if existed else None, existed, new_hash, stop)
            for _ in range(count)
        ]
        _together([functools.partial(lane.run, functools.partial(runs.take, k)) for k, lane in enumerate(lanes)])
        by_index = {i: h for lane in lanes for i, h in lane.hashes.items()}
        hashes = [by_index[i] for i in range(len(out.chunks))]
        written += sum(lane.written for lane in lanes)
        rewritten = sum(lane.rewritten for lane in lanes)
    except BaseException:
        if finisher is not None:
            finisher.abandon()
        os.close(fd)
        raise

    synced: list[os.stat_result] = []

    def sync() -> None:
        try:
            os.fsync(fd)
            _drop_cache(fd, 0, 0)
            synced.append(os.fstat(fd))
        finally:
            os.close(fd)

    def finish() -> None:
        st = synced[0]
        assert finisher is not None
        write_json_atomic(
            ledger_path(final),
            {
                "format": LEDGER_FORMAT, "output_name": os.path.basename(final), "geometry": out.describe(),
                "sources": ident, "hash": hash_name, "chunk_hashes": hashes,
                "output": {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino},
                "written_at": time.time(),
            },
        )  # fmt: skip
        # The data is durable (sync ran first); a SIGKILL from here on loses nothing, and a power
        # cut before the stager's close can only lose the ledger, so the output is packed again.
        os.replace(partial, final)
        finisher.later.append(ledger_path(final))

    finisher.finish(sync, finish)
    return {"bytes_written": written, "chunks_rewritten": rewritten, "chunks_total": len(out.chunks)}


class _Stager:
    """What outlives a job's packing loop: the outputs still finishing in their ``_Finisher``
    threads (one after the other, in the order they were packed), and the locks on the
    destinations, held until they have finished."""

    def __init__(self) -> None:
        self._last: _Finisher | None = None
        self._pending: list[tuple[int, _Finisher]] = []
        self._locks: dict[tuple[int, int], int] = {}

    def finisher(self, fd: int, job: int) -> _Finisher:
        self._last = _Finisher(fd, self._last)
        self._pending.append((job, self._last))
        return self._last

    def lock(self, dst: str) -> None:
        """Hold the stage lock on ``dst`` (once per directory, whatever the spelling of its path)."""
        fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if key in self._locks:
            os.close(fd)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise StageFailure(f"another stage is writing into {dst}; wait for it to finish") from exc
        except OSError:
            pass  # a filesystem without flock (some NFS mounts): stage without the guard
        self._locks[key] = fd

    def close(self) -> dict[int, tuple[BaseException | None, float]]:
        """Wait for every output to finish; per job, its first failure and its outputs' seconds."""
        done: dict[int, tuple[BaseException | None, float]] = {}
        for job, finisher in self._pending:
            failure = finisher.join()
            first, seconds = done.get(job, (None, 0.0))
            done[job] = (first or failure, seconds + finisher.seconds)
        # Every output is written: now the ledgers and the renames become durable, each folder
        # once (see _Finisher).
        folders: dict[str, list[int]] = {}
        for job, finisher in self._pending:
            for path in finisher.later if done[job][0] is None else ():
                t0 = time.monotonic()
                try:
                    fsync(path)
                except OSError as exc:
                    done[job] = (exc, done[job][1])
                done[job] = (done[job][0], done[job][1] + time.monotonic() - t0)
                folders.setdefault(os.path.dirname(path) or ".", []).append(job)
        for folder, jobs in folders.items():
            try:
                fsync(folder)
            except OSError as exc:
                for job in jobs:
                    done[job] = (done[job][0] or exc, done[job][1])
        self._pending.clear()
        for fd in self._locks.values():
            os.close(fd)
        self._locks.clear()
        return done


class _Job:
    """One rank's outputs with their sources open: ``assess`` them, then ``finish`` (stage them);
    two halves, so that all of a node's ranks are checked at once (see ``run_jobs``)."""

    def __init__(self, args: dict[str, Any]) -> None:
        t0 = time.monotonic()
        self.args = args
        self.dst = str(args["dst"])
        tp, rank = int(args["tp"]), int(args["rank"])
        self.mode = str(args.get("mode", "stage"))
        chunk_bytes = int(args.get("chunk_bytes") or DEFAULT_CHUNK_BYTES)
        self.sample_rows = int(args.get("sample_rows", DEFAULT_SAMPLE_ROWS))
        patterns = list(args.get("tables") or ["*.engram.embed.weight"])
        tables, self.headers = find_tables(str(args["src"]), patterns)
        layout = str(args.get("layout") or "packed")
        self.outs = layouts_for(layout, tables, self.headers, tp, rank, self.dst, chunk_bytes)
        self.rng = random.Random(args.get("seed"))
        self.fds: dict[str, int] = {}
        try:
            for out in self.outs:
                for path in out.sources():
                    if path not in self.fds:  # for the sampled rows; lanes open their own (``_Lane.run``)
                        self.fds[path] = os.open(path, os.O_RDONLY)
        except BaseException:
            self.close()
            raise
        self.idents = [source_identity(o, self.headers) for o in self.outs]
        self.checked: list[tuple[str, dict[str, Any] | None]] = []
        self.seconds = time.monotonic() - t0

    def assess(self, picks: list[list[int]]) -> _Job:
        """Check every output, all at once, as their reads are mostly waits; ``picks``: the chunks
        of each to hash."""
        t0 = time.monotonic()
        seeds = [self.rng.random() for _ in self.outs]  # reproducible with a seed, whatever the threads do
        try:
            self.checked = _together(
                [
                    functools.partial(
                        assess, o, i, self.fds, random.Random(seed), self.sample_rows, p, self.mode == "verify"
                    )
                    for o, i, seed, p in zip(self.outs, self.idents, seeds, picks, strict=True)
                ]
            )
        except BaseException:
            self.close()
            raise
        self.seconds += time.monotonic() - t0
        return self

    def finish(self, stager: _Stager, job: int) -> dict[str, Any]:
        """Stage what ``assess`` found wrong (nothing in verify mode); the job's result, but for
        the outputs' finish, which ``stager.close()`` waits for."""
        try:
            t0 = time.monotonic()
            return {**self._stage(stager, job), "seconds": self.seconds + time.monotonic() - t0}
        finally:
            self.close()

    def _stage(self, stager: _Stager, job: int) -> dict[str, Any]:
        outs, checked = self.outs, self.checked
        reports = [
            {"path": o.path, "layout": o.layout, "size": o.size, "status": status, "action": "verified",
             "bytes_written": 0, "chunks_rewritten": 0, "chunks_total": len(o.chunks)}
            for o, (status, _) in zip(outs, checked, strict=True)
        ]  # fmt: skip
        work = [i for i, (status, _) in enumerate(checked) if status != "ok"]
        if self.mode == "verify" or not work:
            return {"outputs": reports, "hash": default_algorithm()}
        import_numpy_in_background()
        # Chunks rewritten in place need no new blocks: only what is not yet allocated counts.
        to_write = sum(
            max(0, outs[i].data_bytes - max(allocated_bytes(p), allocated_bytes(p + PARTIAL_SUFFIX)))
            for i in work
            for p in [outs[i].path]
        )
        check_room(self.dst, int(self.args.get("min_free") or 0), to_write)
        os.makedirs(self.dst, exist_ok=True)
        stager.lock(self.dst)
        progress = Progress(
            self.args.get("progress_file"), sum(outs[i].data_bytes for i in work), self.args.get("job", 0)
        )
        progress.flush()
        for i in work:
            t0 = time.monotonic()
            counts = repack(outs[i], checked[i][1], self.idents[i], progress, stager, job)
            action = "packed" if checked[i][0] in ("missing", "unvouched") else "repaired"
            reports[i].update(counts, action=action, seconds=time.monotonic() - t0)
        progress.flush()
        return {"outputs": reports, "hash": default_algorithm()}

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


def _together(calls: list[Callable[[], _T]]) -> list[_T]:
    """The results of ``calls``, run at once in a thread each; the first failure (in order) raised."""
    if len(calls) < 2:
        return [call() for call in calls]
    results: list[Any] = [None] * len(calls)
    failures: list[BaseException | None] = [None] * len(calls)

    def one(k: int) -> None:
        try:
            results[k] = calls[k]()
        except BaseException as exc:  # raised below, in the caller's thread
            failures[k] = exc

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for exc in failures:
        if exc is not None:
            raise exc
    return results


_EXPECTED = (StageFailure, OSError, KeyError, ValueError, TypeError)


def _caught(call: Callable[[], _T]) -> _T | dict[str, Any]:
    """``call()``, or an expected failure as ``{"ok": False, "error": …}``."""
    try:
        return call()
    except _EXPECTED as exc:
        return failure_result(exc)


def run_job(args: dict[str, Any]) -> dict[str, Any]:
    """Stage (or, with ``mode = "verify"``, only check) every output of one rank; every expected
    failure as ``{"ok": False, "error": …}``."""
    return run_jobs([args])[0]


def _assessed(job: _Job | dict[str, Any], picks: list[list[int]]) -> _Job | dict[str, Any]:
    if isinstance(job, dict):
        return job  # it could not be opened: that failure is its result
    return _caught(functools.partial(job.assess, picks))


def _node_picks(jobs: list[_Job], rng: random.Random) -> list[list[list[int]]]:
    """``chunk_picks`` for each job, the re-staged jobs' outputs sampled together."""
    shared = iter(chunk_picks([o for job in jobs if job.mode != "verify" for o in job.outs], rng, False))
    return [
        chunk_picks(job.outs, rng, True) if job.mode == "verify" else [next(shared) for _ in job.outs] for job in jobs
    ]


def run_jobs(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``run_job`` for each of a node's jobs: all assessed at once (a re-stage is mostly waiting
    for small random reads, which then queue on the disk together), then packed one after the
    other. Jobs that share an output run one by one, each seeing what the one before wrote."""
    opened = _together([functools.partial(_caught, functools.partial(_Job, job)) for job in jobs])
    good = [job for job in opened if isinstance(job, _Job)]
    paths = [o.path for one in good for o in one.outs]
    if len(paths) != len(set(paths)):
        for one in good:
            one.close()
        return [run_job(job) for job in jobs]
    picks = iter(_node_picks(good, random.Random(jobs[0].get("seed") if jobs else None)))
    ready = _together(
        [functools.partial(_assessed, job, next(picks) if isinstance(job, _Job) else []) for job in opened]
    )
    results: list[dict[str, Any]] = []
    stager = _Stager()
    try:
        for k, job in enumerate(ready):
            if isinstance(job, dict):
                results.append(job)
                continue
            try:
                results.append({"ok": True, **job.finish(stager, k)})
            except _EXPECTED as exc:
                results.append(failure_result(exc))
    finally:
        finished = stager.close()
    for k, (failure, seconds) in finished.items():
        if not results[k]["ok"]:
            continue  # its packing failed: that is what it reports
        if failure is None:
            results[k]["seconds"] += seconds
        elif isinstance(failure, _EXPECTED):
            results[k] = failure_result(failure)
        else:
            raise failure
    return results


def main(argv: list[str] | None = None) -> int:
    """One JSON argument in (one job, or ``{"jobs": [...], "progress_file": …}`` for all of a
    node's ranks in one process), one marked JSON line out."""
    words = sys.argv[1:] if argv is None else argv
    if len(words) != 1:
        result: dict[str, Any] = {"ok": False, "error": "usage: stage-worker '<json arguments>'"}
    else:
        try:
            args = json.loads(words[0])
        except ValueError as exc:
            args = {"error": f"bad staging worker arguments: {exc}"}
        if "error" in args:
            result = {"ok": False, "error": args["error"]}
        elif "jobs" in args:
            jobs = [{**job, "job": i, "progress_file": args.get("progress_file")} for i, job in enumerate(args["jobs"])]
            result = {"ok": True, "jobs": run_jobs(jobs)}
        else:
            result = run_job(args)
    sys.stdout.write(RESULT_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result["ok"] else 3


if __name__ == "__main__":
    # OpenBLAS starts a thread per core when numpy is imported, and they spin before they sleep:
    # a pack never calls BLAS, and on a 2-core node those threads took 5-10 % off its rate.
    for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, "1")
    code = main()
    # Everything it wrote is synced and closed, and its result is out: interpreter teardown
    # (numpy's modules, a daemon thread perhaps still importing it) only delays the controller.
    sys.stdout.flush()
    os._exit(code)
