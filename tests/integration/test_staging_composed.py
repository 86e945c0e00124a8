"""composed_model directories: snapshot symlinks plus hard-linked local files, built over a Transport."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkfleet.apply.staging.base import StageReport
from sparkfleet.apply.staging.phase import stage_all
from sparkfleet.errors import StagingError
from sparkfleet.nodes.transport.local import LocalTransport
from sparkfleet.plan.staging import StagingStep
from sparkfleet.plan.staging.composed import Composed

REV = "0123456789abcdef0123456789abcdef01234567"
FILES = {"config.json": b'{"a": 1}', "model-00001-of-00002.safetensors": b"remote shard 1",
         "model-00002-of-00002.safetensors": b"remote shard 2", "tok/tokenizer.json": b"{}"}  # fmt: skip


def hub_repo(hf: Path) -> Path:
    """A Hugging Face cache entry laid out like the hub's: blobs, symlinked snapshot, refs/main."""
    repo = hf / "hub" / "models--org--tiny"
    for i, (name, data) in enumerate(sorted(FILES.items())):
        blob = repo / "blobs" / f"blob{i}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / REV / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    return repo


def composed_step(repo: Path, dst: Path, local_files: tuple[str, ...] = ()) -> StagingStep:
    return StagingStep(Composed(src=str(repo), dst=str(dst), local_files=local_files, repo="org/tiny"), 0, "local")


def stage_rank(transport: LocalTransport, step: StagingStep, verify: bool = False) -> StageReport:
    return stage_all([step], {step.node: transport}, verify=verify)[0]


def test_snapshot_is_symlinked_and_local_files_win(tmp_path: Path) -> None:
    repo = hub_repo(tmp_path / "hf")
    local = tmp_path / "engram-local" / "model-00002-of-00002.safetensors"
    local.parent.mkdir()
    local.write_bytes(b"this rank's sparse copy")
    report = stage_rank(LocalTransport(), composed_step(repo, tmp_path / "composed", (str(local),)))
    model = report.composed
    assert model is not None
    snap = Path(model.model_dir)
    assert snap == tmp_path / "composed" / "models--org--tiny" / "snapshots" / REV
    assert (tmp_path / "composed" / "models--org--tiny" / "refs" / "main").read_text() == REV
    for name, data in FILES.items():
        entry = snap / name
        if name == local.name:
            assert not entry.is_symlink() and entry.stat().st_ino == local.stat().st_ino
            assert entry.read_bytes() == b"this rank's sparse copy"
        else:
            # Links point straight at the blobs, by absolute path, so a container that mounts
            # the blob directory at the same path resolves them.
            target = os.readlink(entry)
            assert os.path.isabs(target) and Path(target).parent == repo / "blobs"
            assert entry.read_bytes() == data
    assert model.extra_mounts == (str(repo / "blobs"),)
    assert (model.links, model.hard_links) == (3, 1)


def test_recompose_follows_the_recipe(tmp_path: Path) -> None:
    repo = hub_repo(tmp_path / "hf")
    local = tmp_path / "l" / "model-00001-of-00002.safetensors"
    local.parent.mkdir()
    local.write_bytes(b"local")
    dst = tmp_path / "composed"
    stage_rank(LocalTransport(), composed_step(repo, dst, (str(local),)))
    snap = dst / "models--org--tiny" / "snapshots" / REV
    (snap / "stray.bin").write_bytes(b"left over")
    # The local file is dropped from the recipe: the snapshot's own file comes back, strays go.
    report = stage_rank(LocalTransport(), composed_step(repo, dst))
    assert report.composed is not None and report.composed.problems == ()
    assert (snap / local.name).is_symlink() and (snap / local.name).read_bytes() == b"remote shard 1"
    assert not (snap / "stray.bin").exists()
    check = stage_rank(LocalTransport(), composed_step(repo, dst), verify=True)
    assert check.composed is not None and check.composed.problems == ()


def test_verify_reports_a_broken_directory_without_touching_it(tmp_path: Path) -> None:
    repo = hub_repo(tmp_path / "hf")
    dst = tmp_path / "composed"
    stage_rank(LocalTransport(), composed_step(repo, dst))
    victim = dst / "models--org--tiny" / "snapshots" / REV / "config.json"
    victim.unlink()
    check = stage_rank(LocalTransport(), composed_step(repo, dst), verify=True)
    assert check.composed is not None
    assert any("config.json" in p for p in check.composed.problems)
    assert not victim.exists()


def test_hard_link_across_filesystems_is_refused_clearly(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a filesystem other than the test's tmp dir")
    repo = hub_repo(tmp_path / "hf")
    local = shm / f"sparkfleet-test-{os.getpid()}.safetensors"
    local.write_bytes(b"on tmpfs")
    try:
        with pytest.raises(StagingError, match=r"^local: composed_model: cannot hard-link .* different filesystems"):
            stage_rank(LocalTransport(), composed_step(repo, tmp_path / "composed", (str(local),)))
    finally:
        local.unlink()


def test_missing_snapshot_says_to_download_first(tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="download the model into the node's Hugging Face cache first"):
        stage_rank(LocalTransport(), composed_step(tmp_path / "hf" / "hub" / "models--org--none", tmp_path / "c"))
