"""Snapshot identity: listing a snapshot, choosing files by glob, and naming what differs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.apply.staging.snapshot_identity import (
    HASH_LIMIT,
    HASHED,
    FileFact,
    Snapshot,
    check_copy,
    check_identity,
    compare,
    parse_scan,
    scan_node,
    scan_snapshot,
    select,
)
from sparkfleet.errors import StagingError
from sparkfleet.nodes.ship import SNAPSHOT_SCAN, shipped_argv
from sparkfleet.nodes.transport.local import LocalTransport

REV1, REV2 = "1" * 40, "2" * 40


def hub_repo(root: Path, rev: str, files: dict[str, bytes], main: bool = True) -> Path:
    repo = root / "models--acme--tiny"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = repo / "snapshots" / rev / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
    return repo


FILES = {
    "config.json": b'{"hidden_size": 64}',
    "model.safetensors.index.json": b'{"weight_map": {}}',
    "model-00001-of-00002.safetensors": b"A" * 4096,
    "model-00002-of-00002.safetensors": b"B" * 2048,
    "original/consolidated.pth": b"C" * 1024,
}


def scan(repo: Path, node: str = "n", revision: str | None = None) -> Snapshot:
    return parse_scan(node, str(repo), scan_snapshot(str(repo), revision, HASHED, HASH_LIMIT))


def test_hub_repo_is_listed_at_main_with_hashes_of_metadata_only(tmp_path: Path) -> None:
    snap = scan(hub_repo(tmp_path, REV1, FILES))
    assert snap.layout == "hf" and snap.revision == REV1 and snap.refs == (("main", REV1),)
    facts = {f.path: f for f in snap.files}
    assert set(facts) == set(FILES)
    assert facts["config.json"].sha256 == hashlib.sha256(FILES["config.json"]).hexdigest()
    assert facts["model-00001-of-00002.safetensors"].sha256 is None  # shards: size and blob name only
    assert facts["model-00001-of-00002.safetensors"].size == 4096
    assert facts["original/consolidated.pth"].blob == "blobs/" + hashlib.sha256(b"C" * 1024).hexdigest()


def test_a_revision_missing_from_the_cache_is_named_with_what_is_there(tmp_path: Path) -> None:
    repo = hub_repo(tmp_path, REV1, FILES)
    with pytest.raises(StagingError, match=rf"^n: .*revision '{REV2}' is not in the cache \(snapshots: {REV1}\)"):
        scan(repo, revision=REV2)
    assert scan(repo, revision=REV1).revision == REV1


def test_plain_folder_is_listed_as_is(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.json").write_text("{}")
    (tmp_path / "b.bin").write_bytes(b"x" * 10)
    snap = scan(tmp_path)
    assert snap.layout == "dir" and snap.revision is None
    assert {f.path: f.size for f in snap.files} == {"sub/a.json": 2, "b.bin": 10}


def test_globs_match_snapshot_paths_and_exclude_wins() -> None:
    files = [FileFact(p, "file", 1, None, None, None) for p in FILES]
    kept = {f.path for f in select(files, (), ("original/*",))}
    assert kept == set(FILES) - {"original/consolidated.pth"}
    only_json = {f.path for f in select(files, ("*.json",), ())}
    assert only_json == {"config.json", "model.safetensors.index.json"}
    assert {f.path for f in select(files, ("*.safetensors", "*.json"), ("*index*",))} == {
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }


def test_same_snapshot_on_two_nodes_agrees(tmp_path: Path) -> None:
    a = scan(hub_repo(tmp_path / "a", REV1, FILES), "node0")
    b = scan(hub_repo(tmp_path / "b", REV1, FILES), "node1")
    assert compare(a, b) is None
    check_identity([a, b])


def test_differences_are_named_per_file(tmp_path: Path) -> None:
    ref = scan(hub_repo(tmp_path / "a", REV1, FILES), "node0")
    changed = dict(FILES)
    changed["config.json"] = b'{"hidden_size": 99}'  # same length, other content
    changed["model-00002-of-00002.safetensors"] = b"B" * 100
    del changed["model-00001-of-00002.safetensors"]
    other = scan(hub_repo(tmp_path / "b", REV1, changed), "node3")
    diff = compare(ref, other)
    assert diff is not None
    assert dict(diff.files) == {
        "config.json": "content differs (sha256)",
        "model-00001-of-00002.safetensors": "missing",
        "model-00002-of-00002.safetensors": "size 100 ≠ 2048",
    }
    with pytest.raises(StagingError) as err:
        check_identity([ref, other])
    message = str(err.value)
    assert message.startswith("node3: snapshot differs from node0's: ")
    assert "config.json: content differs" in message and "model-00001-of-00002.safetensors: missing" in message


def test_another_revision_is_refused_even_when_files_match(tmp_path: Path) -> None:
    ref = scan(hub_repo(tmp_path / "a", REV1, FILES), "node0")
    other = scan(hub_repo(tmp_path / "b", REV2, FILES), "node1")
    with pytest.raises(StagingError, match=rf"^node1: .*revision {REV2} \(reference node0 has {REV1}\)"):
        check_identity([ref, other])


def test_every_differing_node_is_named_and_long_lists_are_cut(tmp_path: Path) -> None:
    many = {f"shard-{i:02d}.bin": bytes([i]) * 10 for i in range(12)}
    ref = scan(hub_repo(tmp_path / "a", REV1, many), "node0")
    empty = scan(hub_repo(tmp_path / "b", REV1, {"x.txt": b"x"}), "node1")
    short = scan(hub_repo(tmp_path / "c", REV1, dict(list(many.items())[:11])), "node2")
    with pytest.raises(StagingError) as err:
        check_identity([ref, empty, short])
    text = str(err.value)
    assert text.startswith("node1: ") and "and 5 more" in text  # 12 missing + 1 extra, 8 shown
    assert "\nnode2: " in text and "shard-11.bin: missing" in text


def test_node_side_script_runs_without_sparkfleet(tmp_path: Path) -> None:
    repo = hub_repo(tmp_path, REV1, FILES)
    args = json.dumps({"root": str(repo), "revision": None, "hashed": HASHED, "hash_limit": HASH_LIMIT})
    argv = shipped_argv(sys.executable, SNAPSHOT_SCAN, [args])  # what scan_node runs on a node
    argv.insert(1, "-I")  # isolated mode, so the program cannot import sparkfleet from this checkout
    out = subprocess.run(argv, capture_output=True, check=True)
    assert parse_scan("n", str(repo), json.loads(out.stdout)) == scan(repo)


def test_read_back_after_a_sync_sees_changed_content_and_missing_files(tmp_path: Path) -> None:
    ref = scan(hub_repo(tmp_path / "a", REV1, FILES), "node0")
    copy_repo = hub_repo(tmp_path / "b", REV1, FILES)
    paths = [f.path for f in ref.files]
    node = LocalTransport("node1")
    assert compare(ref, check_copy(node, str(copy_repo), ref, paths)) is None
    assert check_copy(node, str(copy_repo), ref, paths) == scan_node(node, str(copy_repo), REV1)

    config = (copy_repo / "snapshots" / REV1 / "config.json").resolve()
    config.write_bytes(b'{"hidden_size": 65}')
    (copy_repo / "snapshots" / REV1 / "model-00002-of-00002.safetensors").resolve().unlink()
    diff = compare(ref, check_copy(node, str(copy_repo), ref, paths))
    assert diff is not None
    assert dict(diff.files)["config.json"] == "content differs (sha256)"
    assert dict(diff.files)["model-00002-of-00002.safetensors"].startswith("broken link")
