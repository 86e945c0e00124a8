"""Stage one rank's rows of large tables onto node-local disk (node-side entry point).

Run on the node as ``python3 - '<json args>'`` with this package's node-side modules bundled into
one script (``bundle.py``). For every output file of the rank it first checks what is already
there against its ledger: an output whose ledger matches the source identity, the output's own
stat, its header, a sample of rows compared with the source and a sample of chunk hashes is left
alone. Anything else is (re)built in ``<output>.partial`` — comparing chunk hashes so only chunks
that differ are written — fsynced, described by a fresh ledger, and renamed into place, so the
final path only ever holds a file its ledger vouches for. The last stdout line is a JSON result.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sparkfleet.nodes.shipped.disk import allocated_bytes, check_room
from sparkfleet.nodes.shipped.failure import StageFailure
from sparkfleet.nodes.shipped.layouts import Layout, layouts_for, read_exact
from sparkfleet.nodes.shipped.ledger import (
    LEDGER_FORMAT,
    default_algorithm,
    fsync_dir,
    hash_algorithms,
    read_ledger,
    remove_ledger,
    write_json_atomic,
)
from sparkfleet.nodes.shipped.safetensors_index import ShardHeader, find_tables

DEFAULT_CHUNK_BYTES = 16 << 20
DEFAULT_SAMPLE_ROWS = 128
SAMPLE_CHUNKS = 1  # random chunks hashed against the ledger on a re-stage
# Sampled rows are random reads: issued together they queue on the device (NVMe does ~30x more
# IOPS at depth 64 than at depth 1), instead of paying one latency each.
_SAMPLE_THREADS = 32
PARTIAL_SUFFIX = ".partial"
RESULT_MARKER = "SPARKFLEET-STAGE-RESULT "
_PROGRESS_EVERY = 0.5
_FADV_OK = hasattr(os, "posix_fadvise")


class Progress:
    """Writes ``{"job", "done", "total", "output"}`` to a file the controller polls (atomically)."""

    def __init__(self, path: str | None, total: int, job: int = 0) -> None:
        self.path, self.total, self.done, self.job = path, total, 0, job
        self.output = ""
        self._last = 0.0

    def add(self, n: int, output: str = "") -> None:
        self.done += n
        self.output = output or self.output
        if self.path and time.monotonic() - self._last >= _PROGRESS_EVERY:
            self.flush()

    def flush(self) -> None:
        if not self.path:
            return
        self._last = time.monotonic()
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"job": self.job, "done": self.done, "total": self.total, "output": self.output}, fh)
        os.replace(tmp, self.path)


def _drop_cache(fd: int, offset: int, length: int) -> None:
    # On a DGX Spark the page cache competes with GPU memory; a pack must not fill it.
    if _FADV_OK:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


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
    picked: list[tuple[int, int]] = []
    for table, (lo, hi) in enumerate(out.ranges()):
        if hi <= lo:
            continue
        rows = {lo, hi - 1}
        rows.update(rng.randrange(lo, hi) for _ in range(min(count, hi - lo)))
        picked += [(table, r) for r in sorted(rows)]
    return picked


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


def assess(
    out: Layout, ident: list[dict[str, Any]], fds: dict[str, int], rng: random.Random,
    sample_rows: int, full: bool,
) -> tuple[str, dict[str, Any] | None]:  # fmt: skip
    """``("ok", ledger)`` when the output is vouched for and checks out, else the reason."""
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

        def row_matches(point: tuple[int, int]) -> bool:
            offset, length = out.row_in_output(*point)
            expected = b"".join(os.pread(fds[s], n, o) for s, o, n in out.row_parts(*point))
            return os.pread(fd, length, offset) == expected

        with ThreadPoolExecutor(_SAMPLE_THREADS) as pool:
            if not all(pool.map(row_matches, _sample_rows(out, rng, sample_rows))):
                return "damaged", ledger
        n = len(out.chunks)
        picks = range(n) if full else sorted({rng.randrange(n) for _ in range(SAMPLE_CHUNKS)} if n else set())
        buf = bytearray(out.max_block)
        for i in picks:
            if _chunk_hash(fd, out, i, buf, hash_algorithms()[ledger["hash"]]) != hashes[i]:
                return "damaged", ledger
    finally:
        os.close(fd)
    return "ok", ledger


def repack(
    out: Layout, ledger: dict[str, Any] | None, ident: list[dict[str, Any]], fds: dict[str, int],
    progress: Progress,
) -> dict[str, Any]:  # fmt: skip
    """Make ``out`` right, writing only blocks whose bytes differ; returns counts."""
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
    try:
        if os.fstat(fd).st_size != out.size:
            os.ftruncate(fd, out.size)
        header = out.fixed_header()
        if header and (not existed or os.pread(fd, len(header), 0) != header):
            _write_all(fd, header, 0)
            written += len(header)
        buf = bytearray(out.max_block)
        current = bytearray(out.max_block)
        hashes: list[str] = []
        for i, (_offset, length) in enumerate(out.chunks):
            if existed and expected is not None and _chunk_hash(fd, out, i, current, new_hash) == expected[i]:
                hashes.append(expected[i])
                progress.add(length, final)
                continue
            h = new_hash()
            touched = False
            for boff, blen in out.blocks(i):
                data = out.build(boff, blen, buf, fds)
                h.update(data)
                if existed:
                    view = memoryview(current)[:blen]
                    read_exact(fd, view, boff)
                    if view == data:
                        continue
                _write_all(fd, data, boff)
                written += blen
                touched = True
            rewritten += touched
            if i % 16 == 15:
                for src in out.sources():
                    _drop_cache(fds[src], 0, 0)
            hashes.append(str(h.hexdigest()))
            progress.add(length, final)
        os.fsync(fd)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    for src in out.sources():
        _drop_cache(fds[src], 0, 0)
    write_json_atomic(
        final + ".ledger.json",
        {
            "format": LEDGER_FORMAT, "output_name": os.path.basename(final), "geometry": out.describe(),
            "sources": ident, "hash": hash_name, "chunk_hashes": hashes,
            "output": {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino},
            "written_at": time.time(),
        },
    )  # fmt: skip
    os.replace(partial, final)
    fsync_dir(os.path.dirname(final) or ".")
    return {"bytes_written": written, "chunks_rewritten": rewritten, "chunks_total": len(out.chunks)}


def run(args: dict[str, Any]) -> dict[str, Any]:
    """Stage (or, with ``mode = "verify"``, only check) every output of one rank."""
    src, dst = str(args["src"]), str(args["dst"])
    tp, rank = int(args["tp"]), int(args["rank"])
    mode = str(args.get("mode", "stage"))
    chunk_bytes = int(args.get("chunk_bytes") or DEFAULT_CHUNK_BYTES)
    sample_rows = int(args.get("sample_rows", DEFAULT_SAMPLE_ROWS))
    patterns = list(args.get("tables") or ["*.engram.embed.weight"])
    tables, headers = find_tables(src, patterns)
    outs = layouts_for(str(args.get("layout") or "packed"), tables, headers, tp, rank, dst, chunk_bytes)
    rng = random.Random(args.get("seed"))
    fds: dict[str, int] = {}
    try:
        for out in outs:
            for path in out.sources():
                if path not in fds:
                    fds[path] = os.open(path, os.O_RDONLY)
                    if _FADV_OK:
                        os.posix_fadvise(fds[path], 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return _run_outputs(outs, headers, fds, rng, args, dst, mode, sample_rows)
    finally:
        for fd in fds.values():
            os.close(fd)


def _run_outputs(
    outs: list[Layout], headers: dict[str, ShardHeader], fds: dict[str, int], rng: random.Random,
    args: dict[str, Any], dst: str, mode: str, sample_rows: int,
) -> dict[str, Any]:  # fmt: skip
    started = time.monotonic()
    idents = [source_identity(o, headers) for o in outs]
    checked = [assess(o, i, fds, rng, sample_rows, full=(mode == "verify")) for o, i in zip(outs, idents, strict=True)]
    reports = [
        {"path": o.path, "layout": o.layout, "size": o.size, "status": status, "action": "verified",
         "bytes_written": 0, "chunks_rewritten": 0, "chunks_total": len(o.chunks)}
        for o, (status, _) in zip(outs, checked, strict=True)
    ]  # fmt: skip
    work = [i for i, (status, _) in enumerate(checked) if status != "ok"]
    if mode == "verify" or not work:
        return {"outputs": reports, "hash": default_algorithm(), "seconds": time.monotonic() - started}
    # Chunks rewritten in place need no new blocks: only what is not yet allocated counts.
    to_write = sum(
        max(0, outs[i].data_bytes - max(allocated_bytes(p), allocated_bytes(p + PARTIAL_SUFFIX)))
        for i in work
        for p in [outs[i].path]
    )
    check_room(dst, int(args.get("min_free") or 0), to_write)
    os.makedirs(dst, exist_ok=True)
    lock = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise StageFailure(f"another stage is writing into {dst}; wait for it to finish") from exc
        except OSError:
            pass  # a filesystem without flock (some NFS mounts): stage without the guard
        progress = Progress(args.get("progress_file"), sum(outs[i].data_bytes for i in work), args.get("job", 0))
        progress.flush()
        for i in work:
            t0 = time.monotonic()
            counts = repack(outs[i], checked[i][1], idents[i], fds, progress)
            action = "packed" if checked[i][0] in ("missing", "unvouched") else "repaired"
            reports[i].update(counts, action=action, seconds=time.monotonic() - t0)
        progress.flush()
    finally:
        os.close(lock)
    return {"outputs": reports, "hash": default_algorithm(), "seconds": time.monotonic() - started}


def run_job(args: dict[str, Any]) -> dict[str, Any]:
    """``run`` with every failure turned into ``{"ok": False, "error": …}``."""
    try:
        return {"ok": True, **run(args)}
    except StageFailure as exc:
        return {"ok": False, "error": str(exc)}
    except (KeyError, ValueError, TypeError) as exc:
        return {"ok": False, "error": f"bad staging worker arguments: {exc!r}"}
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return {"ok": False, "error": f"{where}{exc.strerror or exc}"}


def main(argv: list[str] | None = None) -> int:
    """Entry point on the node: one JSON argument in, one marked JSON line out.

    The argument is one job, or ``{"jobs": [...], "progress_file": …}`` for all of a node's ranks
    in one process (one interpreter start per node, not per rank).
    """
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
            result = {"ok": True, "jobs": [run_job(job) for job in jobs]}
        else:
            result = run_job(args)
    sys.stdout.write(RESULT_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result["ok"] else 3


if __name__ == "__main__":
    sys.exit(main())
