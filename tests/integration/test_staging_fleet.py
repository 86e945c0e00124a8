"""``sparkfleet stage`` over SSH on the loopback fleet: real sshd per node, the worker shipped over ssh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fleet.loopback import LoopbackFleet
from tests.integration.test_staging_pack import expected_packed
from tests.synthetic_checkpoint import write_engram_checkpoint

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="openssh-server missing"),
]

REV = "e" * 40
ROWS = {1: 200_003, 14: 150_001}


def write_recipe(folder: Path, nodes: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.toml").write_text(
        f'engine = "sglang"\nmodel = "org/engram"\nrequired_nodes = {nodes}\ntensor_parallel_size = {nodes}\n'
        f'entrypoint = ["{sys.executable}", "-c", "pass"]\n\n'
        '[[staging]]\nkind = "sparse-rows"\nid = "engram"\n'
        f'src = "{{{{hf}}}}/hub/models--org--engram/snapshots/{REV}"\n'
        'dst = "{{hf}}/engram-packed"\nmin_free = "1M"\n'
    )
    return folder


def sparkfleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True)


@pytest.fixture
def staged_fleet(fleet2: LoopbackFleet, tmp_path: Path) -> tuple[LoopbackFleet, Path, Path]:
    source = tmp_path / "source"
    write_engram_checkpoint(source, ROWS, seed=5)
    for node in fleet2.nodes:  # every node has the checkpoint in its own cache (as from a sync)
        snap = node.hf_cache / "hub" / "models--org--engram" / "snapshots" / REV
        snap.parent.mkdir(parents=True)
        shutil.copytree(source, snap, copy_function=os.link)
    return fleet2, write_recipe(tmp_path / "recipe", 2), source


def test_stage_over_ssh_packs_each_nodes_rank_then_skips(staged_fleet: tuple[LoopbackFleet, Path, Path]) -> None:
    fleet, recipe, source = staged_fleet
    first = sparkfleet("stage", str(recipe), "--cluster", str(fleet.cluster_file), "--json")
    assert first.returncode == 0, first.stderr
    rows = json.loads(first.stdout)
    assert sorted((r["node"], r["rank"], r["status"]) for r in rows) == [
        ("node0", 0, "missing"), ("node0", 0, "missing"), ("node1", 1, "missing"), ("node1", 1, "missing"),
    ]  # fmt: skip
    for rank, node in enumerate(fleet.nodes):
        for layer in ROWS:
            out = node.hf_cache / "engram-packed" / f"engram-l{layer}-r{rank}of2.bin"
            assert out.read_bytes() == expected_packed(source, layer, rank, 2)
    again = sparkfleet("stage", str(recipe), "--cluster", str(fleet.cluster_file), "--json")
    assert again.returncode == 0, again.stderr
    assert {(r["status"], r["action"], r["bytes_written"]) for r in json.loads(again.stdout)} == {("ok", "verified", 0)}


def test_verify_names_the_damaged_node_and_stage_repairs_it(staged_fleet: tuple[LoopbackFleet, Path, Path]) -> None:
    fleet, recipe, source = staged_fleet
    assert sparkfleet("stage", str(recipe), "--cluster", str(fleet.cluster_file)).returncode == 0
    victim = fleet.nodes[1].hf_cache / "engram-packed" / "engram-l14-r1of2.bin"
    with victim.open("r+b") as fh:
        fh.seek(4096 + 1000 * 264)
        fh.write(b"\xee" * 16)
    check = sparkfleet("stage", str(recipe), "--cluster", str(fleet.cluster_file), "--verify")
    assert check.returncode == 2
    assert f"node1: {victim} is not as staged: modified" in " ".join(check.stderr.split())
    fixed = sparkfleet("stage", str(recipe), "--cluster", str(fleet.cluster_file), "--json")
    assert fixed.returncode == 0, fixed.stderr
    repaired = [r for r in json.loads(fixed.stdout) if r["path"] == str(victim)]
    assert [(r["action"], r["chunks_rewritten"]) for r in repaired] == [("repaired", 1)]
    assert victim.read_bytes() == expected_packed(source, 14, 1, 2)
    assert sparkfleet("stage", str(recipe), "--cluster", str(fleet.cluster_file), "--verify").returncode == 0
