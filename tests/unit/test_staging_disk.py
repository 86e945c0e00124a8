"""Free-space checks made before staging writes anything."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sparkfleet.nodes.shipped.disk import allocated_bytes, check_room, existing_ancestor, free_bytes, human
from sparkfleet.nodes.shipped.failure import StageFailure


def test_a_destination_that_does_not_exist_yet_is_measured_on_its_parent(tmp_path: Path) -> None:
    assert existing_ancestor(str(tmp_path / "a" / "b" / "c")) == str(tmp_path)
    st = os.statvfs(tmp_path)
    assert abs(free_bytes(str(tmp_path / "a" / "b")) - st.f_bavail * st.f_frsize) < 64 << 20


def test_refusal_names_path_free_and_needed(tmp_path: Path) -> None:
    free = free_bytes(str(tmp_path))
    with pytest.raises(StageFailure) as err:
        check_room(str(tmp_path / "engram"), min_free=55 * 2**30 + free, to_write=48 * 2**30)
    message = str(err.value)
    assert f"not enough free space at {tmp_path / 'engram'}" in message
    assert re.search(r": [\d.]+ [KMGT]?i?B free, [\d.]+ [KMGT]?i?B needed \(", message)
    assert "48.0 GiB to write + min_free" in message


def test_nothing_to_write_needs_no_room(tmp_path: Path) -> None:
    check_room(str(tmp_path), min_free=10**18, to_write=0)


def test_holes_do_not_count_as_allocated(tmp_path: Path) -> None:
    sparse = tmp_path / "sparse.bin"
    with sparse.open("wb") as fh:
        fh.truncate(1 << 30)
    assert allocated_bytes(str(sparse)) < 1 << 20
    assert allocated_bytes(str(tmp_path / "absent")) == 0


def test_human_sizes() -> None:
    assert human(512) == "512 B"
    assert human(55 * 2**30) == "55.0 GiB"
    assert human(1536 * 2**20) == "1.5 GiB"
