"""nodes/files.py and nodes/facts.py, each command run for real on this machine (the local
transport, as on a node) and its answer read by its parser; the parsers also on captured output."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from sparkfleet.nodes import files
from sparkfleet.nodes.facts import mem_available, parse_mem_available
from sparkfleet.nodes.nfs import parse_nfsd_threads
from sparkfleet.nodes.transport import controller


def test_hashes_of_the_files_that_exist(tmp_path: Path) -> None:
    (tmp_path / "a b.json").write_bytes(b"{}")
    paths = [str(tmp_path / "a b.json"), str(tmp_path / "missing"), str(tmp_path)]
    result = files.sha256_of(controller(), paths)
    assert result.ok
    assert files.parse_sha256sum(result.stdout) == {str(tmp_path / "a b.json"): hashlib.sha256(b"{}").hexdigest()}
    captured = "d41d8cd98f00b204e9800998ecf8427e  ./x\ne3b0c44298fc1c149afbf4c8996fb924  *./bin y\n"
    assert files.parse_sha256sum(captured) == {"./x": "d41d8cd98f00b204e9800998ecf8427e",
                                               "./bin y": "e3b0c44298fc1c149afbf4c8996fb924"}  # fmt: skip


def test_stat_entries_give_size_mtime_and_link_targets(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"12345")
    os.utime(tmp_path / "f", (1_700_000_000, 1_700_000_000))
    (tmp_path / "l").symlink_to("f")
    result = files.stat_entries(controller(), str(tmp_path), ["f", "l", "gone"])
    assert files.parse_stat_entries(result.stdout) == {"f": (5, 1_700_000_000, None), "l": (0, 0, "f")}


def test_files_folders_and_markers(tmp_path: Path) -> None:
    node = controller()
    folder = str(tmp_path / "d" / "e")
    assert files.make_dir(node, folder).ok and files.is_dir(node, folder)
    marker = f"{folder}/.m"
    assert files.make_marker(node, folder, marker) and files.exists(node, marker)
    assert files.read_text(node, marker) == "" and files.readable(node, [marker, folder + "/x"]) == {marker}
    files.remove(node, marker, folder + "/x")
    assert not files.exists(node, marker) and files.read_text(node, marker) is None


def test_mem_available_reads_this_machines_meminfo() -> None:
    assert mem_available(controller()) > 0
    assert parse_mem_available("MemTotal: 4 kB\nMemAvailable:    2048 kB\n") == 2048 * 1024
    with pytest.raises(ValueError, match="no MemAvailable"):
        parse_mem_available("MemTotal: 1 kB\n")


def test_nfsd_threads_parses_the_kernels_answer() -> None:
    assert parse_nfsd_threads("8\n") == 8 and parse_nfsd_threads("0\n") == 0
    assert parse_nfsd_threads(None) is None and parse_nfsd_threads("") is None
