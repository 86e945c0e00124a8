"""sparse-rows staging on real files, through the LocalTransport and the shipped worker script.

Expected bytes are computed here from the source with numpy, independently of the packer: the
test parses the safetensors header itself and slices the tables as arrays.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import xxhash

from sparkfleet.apply.staging.base import StageReport
from sparkfleet.apply.staging.phase import stage_all
from sparkfleet.errors import StagingError
from sparkfleet.nodes.ship import STAGE_WORKER, program_text
from sparkfleet.nodes.transport.local import LocalTransport
from sparkfleet.plan.staging import StagingStep
from sparkfleet.plan.staging.sparse_rows import SparseRows
from tests.synthetic_checkpoint import write_engram_checkpoint

ROWS = {1: 300_007, 14: 250_003}
CHUNK = 1 << 20
MAGIC = 0x31344E4531565344


def make_step(
    src: Path,
    dst: Path,
    rank: int,
    *,
    tp: int = 4,
    layout: str = "packed",
    min_free: int = 0,
    node: str = "local",
) -> StagingStep:
    entry = SparseRows(id="engram", src=str(src), dst=str(dst), min_free=min_free, layout=layout)  # type: ignore[arg-type]
    return StagingStep(entry, rank=rank, node=node, tp=tp)


def stage(step: StagingStep, python: str | None = None, **kw: object) -> StageReport:
    pythons = {step.node: python} if python else None
    return stage_all([step], {step.node: LocalTransport(step.node)}, chunk_bytes=CHUNK, pythons=pythons, **kw)[0]  # type: ignore[arg-type]


def up_to_date(report: StageReport) -> bool:
    """Every output was already right: nothing needed writing."""
    return all(o.status == "ok" for o in report.outputs)


def tensor(shard: Path, name: str) -> np.ndarray:
    """A 2-D tensor of a shard as uint8 rows, read with the test's own header parser."""
    with shard.open("rb") as fh:
        (hlen,) = struct.unpack("<Q", fh.read(8))
        entry = json.loads(fh.read(hlen))[name]
    begin, end = entry["data_offsets"]
    rows = entry["shape"][0]
    return np.fromfile(shard, dtype=np.uint8, count=end - begin, offset=8 + hlen + begin).reshape(rows, -1)


def expected_packed(snapshot: Path, layer: int, rank: int, tp: int) -> bytes:
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    wname, sname = f"layers.{layer}.engram.embed.weight", f"layers.{layer}.engram.embed.scale"
    weight, scale = tensor(snapshot / index[wname], wname), tensor(snapshot / index[sname], sname)
    rows = weight.shape[0]
    lo, hi = rows * rank // tp, rows * (rank + 1) // tp
    header = struct.pack("<6Q", MAGIC, layer, lo, hi, rows, 264).ljust(4096, b"\0")
    return header + np.concatenate([weight[lo:hi], scale[lo:hi]], axis=1).tobytes()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    snapshot = tmp_path_factory.mktemp("ckpt") / "snapshot"
    write_engram_checkpoint(snapshot, ROWS, seed=7)
    return snapshot


@pytest.fixture
def snapshot(pristine: Path, tmp_path: Path) -> Path:
    """A private copy for tests that change the source."""
    copy = tmp_path / "snapshot"
    shutil.copytree(pristine, copy)
    return copy


def test_packed_output_is_byte_exact_for_every_rank(pristine: Path, tmp_path: Path) -> None:
    for rank in range(4):
        report = stage(make_step(pristine, tmp_path / "out", rank))
        assert [o.status for o in report.outputs] == ["missing", "missing"]
        for layer in ROWS:
            out = tmp_path / "out" / f"engram-l{layer}-r{rank}of4.bin"
            data = out.read_bytes()
            assert data == expected_packed(pristine, layer, rank, 4)
            magic, got_layer, lo, hi, rows, row_bytes = struct.unpack("<6Q", data[:48])
            assert (magic, got_layer, rows, row_bytes) == (MAGIC, layer, ROWS[layer], 264)
            assert (lo, hi) == (ROWS[layer] * rank // 4, ROWS[layer] * (rank + 1) // 4)
            assert data[48:4096] == bytes(4048)
            assert len(data) == 4096 + (hi - lo) * 264
    assert not list((tmp_path / "out").glob("*.partial"))


def test_sparse_file_keeps_offsets_and_only_this_ranks_rows(pristine: Path, tmp_path: Path) -> None:
    stage(make_step(pristine, tmp_path / "out", 2, layout="sparse-file"))
    name = "model-00002-of-00003.safetensors"
    src, out = pristine / name, tmp_path / "out" / name
    assert out.stat().st_size == src.stat().st_size
    raw_src, raw_out = src.read_bytes(), out.read_bytes()
    (hlen,) = struct.unpack("<Q", raw_src[:8])
    assert raw_out[: 8 + hlen] == raw_src[: 8 + hlen]
    rows = ROWS[1]
    lo, hi = rows * 2 // 4, rows * 3 // 4
    for tname in ("layers.1.engram.embed.weight", "layers.1.engram.embed.scale"):
        want, got = tensor(src, tname), tensor(out, tname)
        assert np.array_equal(got[lo:hi], want[lo:hi])
        assert not got[:lo].any() and not got[hi:].any()
    assert not tensor(out, "layers.1.engram.wkv.weight").any()
    # Holes, not zeros: the file holds about a quarter of the shard on disk.
    assert out.stat().st_blocks * 512 < 0.35 * out.stat().st_size


def test_unchanged_restage_verifies_and_writes_nothing(pristine: Path, tmp_path: Path) -> None:
    step = make_step(pristine, tmp_path / "out", 1)
    stage(step)
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in (tmp_path / "out").iterdir()}
    report = stage(step)
    assert [(o.status, o.action, o.bytes_written) for o in report.outputs] == [("ok", "verified", 0)] * 2
    after = {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in (tmp_path / "out").iterdir()}
    assert after == before


def test_a_corrupted_byte_is_repaired_by_rewriting_only_its_chunk(pristine: Path, tmp_path: Path) -> None:
    step = make_step(pristine, tmp_path / "out", 3)
    stage(step)
    out = tmp_path / "out" / "engram-l1-r3of4.bin"
    with out.open("r+b") as fh:
        fh.seek(4096 + 40_000 * 264 + 17)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    report = stage(step)
    damaged = next(o for o in report.outputs if o.path == str(out))
    assert (damaged.status, damaged.action, damaged.chunks_rewritten) == ("modified", "repaired", 1)
    assert damaged.bytes_written <= CHUNK
    assert out.read_bytes() == expected_packed(pristine, 1, 3, 4)
    assert up_to_date(stage(step))


def test_verify_finds_silent_damage_and_writes_nothing(pristine: Path, tmp_path: Path) -> None:
    step = make_step(pristine, tmp_path / "out", 0)
    stage(step)
    out = tmp_path / "out" / "engram-l14-r0of4.bin"
    st = out.stat()
    with out.open("r+b") as fh:  # bit rot: one byte changes, the mtime does not
        fh.seek(st.st_size - 1000)
        fh.write(b"\x00" if fh.read(1) != b"\x00" else b"\x01")
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = stage(step, verify=True)
    assert {Path(o.path).name: o.status for o in report.outputs} == {
        "engram-l1-r0of4.bin": "ok",
        "engram-l14-r0of4.bin": "damaged",
    }
    assert out.read_bytes() != expected_packed(pristine, 14, 0, 4)  # verify wrote nothing


def test_changed_source_repacks_only_the_chunks_that_differ(snapshot: Path, tmp_path: Path) -> None:
    step = make_step(snapshot, tmp_path / "out", 1)
    stage(step)
    shard = snapshot / "model-00003-of-00003.safetensors"
    weight = tensor(shard, "layers.14.engram.embed.weight")
    row = ROWS[14] * 1 // 4 + 12_345  # inside rank 1's range
    assert weight.shape == (ROWS[14], 256)
    with shard.open("rb") as fh:
        (hlen,) = struct.unpack("<Q", fh.read(8))
        begin = json.loads(fh.read(hlen))["layers.14.engram.embed.weight"]["data_offsets"][0]
    with shard.open("r+b") as fh:
        fh.seek(8 + hlen + begin + row * 256)
        fh.write(b"\x42" * 256)
    report = stage(step)
    by_name = {Path(o.path).name: o for o in report.outputs}
    assert by_name["engram-l1-r1of4.bin"].status == "ok"
    changed = by_name["engram-l14-r1of4.bin"]
    assert (changed.status, changed.action, changed.chunks_rewritten) == ("source-changed", "repaired", 1)
    assert (tmp_path / "out" / "engram-l14-r1of4.bin").read_bytes() == expected_packed(snapshot, 14, 1, 4)


def test_a_source_rewritten_in_place_is_caught_by_the_sampled_rows(snapshot: Path, tmp_path: Path) -> None:
    # Same size, same mtime, same header: only comparing rows with the source can tell. Every
    # 5th scale row of rank 2's range changes.
    step = make_step(snapshot, tmp_path / "out", 2)
    stage(step)
    shard = snapshot / "model-00003-of-00003.safetensors"
    name = "layers.14.engram.embed.scale"
    st = shard.stat()
    with shard.open("rb") as fh:
        (hlen,) = struct.unpack("<Q", fh.read(8))
        begin = json.loads(fh.read(hlen))[name]["data_offsets"][0]
    with shard.open("r+b") as fh:
        for row in range(ROWS[14] * 2 // 4, ROWS[14] * 3 // 4, 5):
            fh.seek(8 + hlen + begin + row * 8)
            fh.write(b"\x5a" * 8)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = stage(step)
    by_name = {Path(o.path).name: o for o in report.outputs}
    assert by_name["engram-l1-r2of4.bin"].status == "ok"
    changed = by_name["engram-l14-r2of4.bin"]
    assert (changed.status, changed.action) == ("damaged", "repaired")
    assert (tmp_path / "out" / "engram-l14-r2of4.bin").read_bytes() == expected_packed(snapshot, 14, 2, 4)


def test_a_node_without_numpy_or_xxhash_packs_the_same_bytes(pristine: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare-python"
    bare.write_text('#!/bin/sh\nexec python3 -S -I "$@"\n')
    bare.chmod(0o755)
    probe = subprocess.run([str(bare), "-c", "import numpy"], capture_output=True)
    assert probe.returncode != 0, "the bare interpreter must not see numpy"
    step = make_step(pristine, tmp_path / "out", 2)
    report = stage(step, python=str(bare))
    assert report.hash == "blake2b-64"
    for layer in ROWS:
        assert (tmp_path / "out" / f"engram-l{layer}-r2of4.bin").read_bytes() == expected_packed(pristine, layer, 2, 4)
    # A later stage with numpy/xxhash available still trusts the ledger's BLAKE2b hashes.
    assert up_to_date(stage(step))


def test_progress_is_reported_in_bytes(pristine: Path, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    report = stage(make_step(pristine, tmp_path / "out", 0), progress=lambda s, d, t: seen.append((d, t)))
    total = sum(o.size for o in report.outputs)
    assert seen and seen[-1] == (total, total)
    assert all(d <= t for d, t in seen)


def test_min_free_is_enforced_before_anything_is_written(pristine: Path, tmp_path: Path) -> None:
    step = make_step(pristine, tmp_path / "out", 0, min_free=10**18)
    with pytest.raises(StagingError) as err:
        stage(step)
    message = str(err.value)
    assert message.startswith("local: ") and str(tmp_path / "out") in message
    assert "free" in message and "needed" in message and "min_free" in message
    assert not (tmp_path / "out").exists()


def test_a_full_disk_is_refused_up_front(pristine: Path, tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        with pytest.raises(StagingError, match=r"not enough free space at .*small/engram: .* free, .* needed"):
            stage(make_step(pristine, small / "engram", 0))
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_stage_all_runs_every_node_and_names_the_one_that_failed(pristine: Path, tmp_path: Path) -> None:
    nodes = [f"node{i}" for i in range(4)]
    steps = [make_step(pristine, tmp_path / n, r, node=n) for r, n in enumerate(nodes)]
    steps[2] = make_step(tmp_path / "missing", tmp_path / "node2", 2, node="node2")
    transports = {n: LocalTransport(n) for n in nodes}
    with pytest.raises(StagingError, match=r"^node2: .*source .*missing does not exist"):
        stage_all(steps, transports, chunk_bytes=CHUNK)
    for rank, node in enumerate(nodes):
        if node != "node2":
            assert (tmp_path / node / f"engram-l1-r{rank}of4.bin").read_bytes() == expected_packed(pristine, 1, rank, 4)
    good = [s for s in steps if s.node != "node2"]
    reports = stage_all(good, transports, chunk_bytes=CHUNK)
    assert sorted(r.node for r in reports) == ["node0", "node1", "node3"] and all(map(up_to_date, reports))


def _worker(step: StagingStep) -> subprocess.Popen[bytes]:
    args = {"src": step.src, "dst": step.dst, "tp": step.tp, "rank": step.rank, "layout": "packed",
            "min_free": 0, "chunk_bytes": CHUNK}  # fmt: skip
    proc = subprocess.Popen(["python3", "-", json.dumps(args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(program_text(STAGE_WORKER).encode())
    proc.stdin.close()
    return proc


def _kill_mid_write(proc: subprocess.Popen[bytes], partial: Path, after: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if partial.stat().st_blocks * 512 >= after:
                break
        except FileNotFoundError:
            pass
        time.sleep(0.001)
    assert proc.poll() is None, "the pack finished before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _vouched_or_absent(out: Path) -> None:
    """Whatever sits at the final path is exactly what its ledger describes, chunk by chunk."""
    if not out.exists():
        return
    ledger = json.loads(Path(str(out) + ".ledger.json").read_text())
    assert ledger["hash"] == "xxh3_64"
    st = out.stat()
    assert ledger["output"] == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
    data = out.read_bytes()
    chunks = ledger["geometry"]["chunks"]
    assert [xxhash.xxh3_64_hexdigest(data[o : o + n]) for o, n in chunks] == ledger["chunk_hashes"]


@pytest.mark.slow
def test_sigkill_mid_pack_then_rerun_gives_identical_bytes(tmp_path: Path) -> None:
    snapshot = tmp_path / "big"
    write_engram_checkpoint(snapshot, {1: 3_000_000}, seed=3)
    step = make_step(snapshot, tmp_path / "out", 0, tp=1)
    out = tmp_path / "out" / "engram-l1-r0of1.bin"
    partial = Path(str(out) + ".partial")
    expected = expected_packed(snapshot, 1, 0, 1)

    # 1. A first pack killed a quarter of the way: no file at the final path.
    proc = _worker(step)
    _kill_mid_write(proc, partial, len(expected) // 4)
    assert not out.exists() and partial.exists()
    _vouched_or_absent(out)
    report = stage(step)
    assert report.outputs[0].status == "missing"
    assert 0 < report.outputs[0].chunks_rewritten < report.outputs[0].chunks_total  # resumed, not redone
    assert out.read_bytes() == expected

    # 2. A repack after the source changed, killed mid-way: the final path is absent or vouched for.
    shard = snapshot / "model-00002-of-00002.safetensors"
    with shard.open("r+b") as fh:
        fh.seek(-256 * 1000, os.SEEK_END)
        fh.write(os.urandom(256 * 1000))
    os.posix_fadvise(os.open(out, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    proc = _worker(step)
    _kill_mid_write(proc, partial, 1)  # as soon as the old output has become the partial
    _vouched_or_absent(out)
    stage(step)
    assert out.read_bytes() == expected_packed(snapshot, 1, 0, 1)


def test_one_worker_stages_every_rank_of_a_node(pristine: Path, tmp_path: Path) -> None:
    """All ranks in one worker process (as for a node that serves several): assessed together,
    packed one after the other while the one before finishes, each byte-exact."""
    steps = [make_step(pristine, tmp_path / "out", rank) for rank in range(4)]
    transports = {"local": LocalTransport("local")}
    reports = stage_all(steps, transports, chunk_bytes=CHUNK)
    assert sorted(r.rank for r in reports) == [0, 1, 2, 3]
    assert {o.status for r in reports for o in r.outputs} == {"missing"}
    for rank in range(4):
        for layer in ROWS:
            out = tmp_path / "out" / f"engram-l{layer}-r{rank}of4.bin"
            assert out.read_bytes() == expected_packed(pristine, layer, rank, 4)
    assert not list((tmp_path / "out").glob("*.partial"))
    victim = tmp_path / "out" / "engram-l14-r2of4.bin"
    with victim.open("r+b") as fh:
        fh.seek(4096 + 5 * 264)
        fh.write(b"\x01" * 8)
    again = stage_all(steps, transports, chunk_bytes=CHUNK)
    statuses = {(r.rank, Path(o.path).name): (o.status, o.chunks_rewritten) for r in again for o in r.outputs}
    assert statuses.pop((2, victim.name)) == ("modified", 1)
    assert set(statuses.values()) == {("ok", 0)}
    assert victim.read_bytes() == expected_packed(pristine, 14, 2, 4)


def test_jobs_sharing_an_output_run_one_after_the_other(pristine: Path, tmp_path: Path) -> None:
    step = make_step(pristine, tmp_path / "out", 1)
    reports = stage_all([step, step], {"local": LocalTransport("local")}, chunk_bytes=CHUNK)
    assert [[o.status for o in r.outputs] for r in reports] == [["missing", "missing"], ["ok", "ok"]]
    for layer in ROWS:
        assert (tmp_path / "out" / f"engram-l{layer}-r1of4.bin").read_bytes() == expected_packed(pristine, layer, 1, 4)


@pytest.mark.parametrize("lanes", [1, 3])
def test_packing_in_one_lane_or_several_gives_the_same_bytes(
    pristine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lanes: int
) -> None:
    """In-process, so the lane count can be set (the worker packs an output in two lanes); the
    lanes take chunks in turn, and the repair below lands in whichever lane takes its chunk."""
    from sparkfleet.nodes.shipped import sparse_rows

    monkeypatch.setattr(sparse_rows, "_LANES", lanes)
    args = {"src": str(pristine), "dst": str(tmp_path / "out"), "tp": 4, "rank": 3, "chunk_bytes": CHUNK}
    first = sparse_rows.run_job(dict(args))
    assert first["ok"] and {o["status"] for o in first["outputs"]} == {"missing"}
    out = tmp_path / "out" / "engram-l1-r3of4.bin"
    with out.open("r+b") as fh:  # one block of one chunk, then a resumed repair
        fh.seek(4096 + 10_000 * 264)
        fh.write(b"\xaa" * 64)
    again = sparse_rows.run_job(dict(args))
    by_name = {Path(o["path"]).name: o for o in again["outputs"]}
    assert (by_name[out.name]["status"], by_name[out.name]["chunks_rewritten"]) == ("modified", 1)
    assert by_name[out.name]["bytes_written"] <= CHUNK
    for layer in ROWS:
        assert (tmp_path / "out" / f"engram-l{layer}-r3of4.bin").read_bytes() == expected_packed(pristine, layer, 3, 4)


def test_a_lane_that_finishes_first_takes_over_half_of_the_slower_lanes_run(
    pristine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each lane packs a contiguous run of chunks; when one is done while the other still has
    several chunks left (its disk slower, say), it packs the second half of them, so the output is
    not finished by one lane alone. The bytes are the same."""
    from sparkfleet.nodes.shipped import sparse_rows

    real = sparse_rows._write_all
    size = 4096 + (ROWS[1] // 4) * 264  # rank 0's layer-1 output; one 1 MiB block per chunk
    chunks = -(-(ROWS[1] // 4) // (CHUNK // 264))
    second = 4096 + chunks // 2 * (CHUNK // 264) * 264  # where the second lane's run begins
    writers: dict[int, int] = {}

    def slow_first_half(fd: int, data: object, offset: int) -> None:
        if offset and os.fstat(fd).st_size == size:
            writers[offset] = threading.get_ident()
            if offset < second:
                time.sleep(0.1)
        real(fd, data, offset)

    monkeypatch.setattr(sparse_rows, "_write_all", slow_first_half)
    monkeypatch.setattr(sparse_rows, "numpy_pending", lambda: False)
    args = {"src": str(pristine), "dst": str(tmp_path / "out"), "tp": 4, "rank": 0, "chunk_bytes": CHUNK}
    result = sparse_rows.run_job(dict(args))
    assert result["ok"], result
    assert len(writers) == chunks
    first_lane, second_lane = writers[4096], writers[second]
    assert first_lane != second_lane
    taken_over = sorted(o for o, t in writers.items() if o < second and t == second_lane)
    assert len(taken_over) >= 2, writers  # the second lane packed part of the first lane's run...
    assert taken_over[-1] == max(o for o in writers if o < second)  # ...its end, contiguously
    for layer in ROWS:
        assert (tmp_path / "out" / f"engram-l{layer}-r0of4.bin").read_bytes() == expected_packed(pristine, layer, 0, 4)


def test_a_failure_while_an_output_finishes_fails_its_own_job_only(
    pristine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outputs finish (fsync, ledger, rename) in the background while the next is packed: a
    failure there is reported by the job that packed it, and leaves nothing at its final path."""
    from sparkfleet.nodes.shipped import sparse_rows

    real = sparse_rows.write_json_atomic

    def failing(path: str, obj: dict[str, object], **how: bool) -> None:
        if "-r2of4.bin" in path:
            raise OSError(28, "No space left on device", path)
        real(path, obj, **how)

    monkeypatch.setattr(sparse_rows, "write_json_atomic", failing)
    args = {"src": str(pristine), "dst": str(tmp_path / "out"), "tp": 4, "chunk_bytes": CHUNK}
    jobs = [{**args, "rank": r} for r in range(4)]
    results = sparse_rows.run_jobs(jobs)
    assert [r["ok"] for r in results] == [True, True, False, True]
    assert "No space left on device" in results[2]["error"]
    for rank in (0, 1, 3):
        for layer in ROWS:
            assert (tmp_path / "out" / f"engram-l{layer}-r{rank}of4.bin").read_bytes() == expected_packed(
                pristine, layer, rank, 4
            )
    assert not list((tmp_path / "out").glob("engram-*-r2of4.bin"))
    assert not list((tmp_path / "out").glob("engram-*-r2of4.bin.ledger.json"))


def test_a_write_failing_in_one_lane_fails_the_output_and_stops_the_other_lane(
    pristine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills under one lane while the other holds a chunk: the job reports it, the other
    lane writes only the chunk it holds and stops, no thread is left, the final path holds
    nothing unvouched, and a later stage finishes the output."""
    from sparkfleet.nodes.shipped import sparse_rows

    real = sparse_rows._write_all
    size = 4096 + (ROWS[1] // 4) * 264  # rank 0's layer-1 output; one 1 MiB block per chunk
    failed = threading.Event()
    first_writer: list[int] = []
    after: list[int] = []

    def filling(fd: int, data: object, offset: int) -> None:
        if offset and os.fstat(fd).st_size == size:
            me = threading.get_ident()
            first_writer[:] = first_writer or [me]
            if me != first_writer[0]:  # the other lane's first write: the disk is full
                failed.set()
                raise OSError(28, "No space left on device")
            assert failed.wait(10), "the other lane never wrote"
            after.append(offset)
        real(fd, data, offset)

    monkeypatch.setattr(sparse_rows, "_write_all", filling)
    # Lanes that warm the page cache while numpy is imported take several chunks each first;
    # here each lane must hold one chunk at a time.
    monkeypatch.setattr(sparse_rows, "numpy_pending", lambda: False)
    before = set(threading.enumerate())
    args = {"src": str(pristine), "dst": str(tmp_path / "out"), "tp": 4, "rank": 0, "chunk_bytes": CHUNK}
    result = sparse_rows.run_job(dict(args))
    assert not result["ok"] and "No space left on device" in result["error"]
    left = [t.name for t in set(threading.enumerate()) - before if t.name != "numpy-import" and t.is_alive()]
    assert left == []  # every lane and finisher has ended
    assert len(after) == 1  # the first lane's chunk in hand, then it stopped
    assert not (tmp_path / "out" / "engram-l1-r0of4.bin").exists()
    assert not (tmp_path / "out" / "engram-l1-r0of4.bin.ledger.json").exists()

    monkeypatch.setattr(sparse_rows, "_write_all", real)
    again = sparse_rows.run_job(dict(args))
    assert again["ok"]
    for layer in ROWS:
        assert (tmp_path / "out" / f"engram-l{layer}-r0of4.bin").read_bytes() == expected_packed(pristine, layer, 0, 4)


# Each costs a re-stage more than checking the outputs does (numpy alone ~0.1 s).
NOT_FOR_RESTAGE = ("dataclasses", "numpy", "subprocess")


def test_a_restage_of_unchanged_outputs_imports_nothing_heavy(pristine: Path, tmp_path: Path) -> None:
    imports = tmp_path / "imports.log"
    python = tmp_path / "python-importtime"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -X importtime "$@" 2>"{imports}"\n')
    python.chmod(0o755)
    step = make_step(pristine, tmp_path / "out", 3)
    assert not up_to_date(stage(step, python=str(python)))
    report = stage(step, python=str(python))
    assert [(o.status, o.action, o.bytes_written) for o in report.outputs] == [("ok", "verified", 0)] * 2
    lines = imports.read_text().splitlines()
    loaded = {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}
    assert "xxhash" in loaded  # the log is the re-stage's own
    heavy = sorted(m for m in loaded if m.split(".")[0] in NOT_FOR_RESTAGE)
    assert heavy == [], f"a re-stage imports {heavy}"


def test_verify_compares_every_row_with_the_source_not_the_ledger(snapshot: Path, tmp_path: Path) -> None:
    """A source rewritten in place, its size, header and mtime kept: the ledger still vouches
    for the output, and only reading every row range against the source sees the difference."""
    step = make_step(snapshot, tmp_path / "out", 0)
    stage(step)
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    name = "layers.14.engram.embed.weight"
    shard = snapshot / index[name]
    with shard.open("rb") as fh:
        (hlen,) = struct.unpack("<Q", fh.read(8))
        begin = json.loads(fh.read(hlen))[name]["data_offsets"][0]
    st = shard.stat()
    row = 31_337  # rank 0's share, away from its first and last rows
    with shard.open("r+b") as fh:  # one row of the source changes; nothing else does
        fh.seek(8 + hlen + begin + row * 256)
        old = fh.read(256)
        fh.seek(-256, os.SEEK_CUR)
        fh.write(bytes(b ^ 0x5A for b in old))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = stage(step, verify=True)
    assert {Path(o.path).name: o.status for o in report.outputs} == {
        "engram-l1-r0of4.bin": "ok",
        "engram-l14-r0of4.bin": "damaged",
    }
