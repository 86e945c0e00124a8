"""``sync`` staging on the loopback fleet: real sshd per node, real rsync, real files in HF layout."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkfleet.apply.staging.phase import distribute
from sparkfleet.apply.staging.transfer import SyncReport
from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.errors import StagingError
from sparkfleet.nodes.transport.ssh import SshTransport
from sparkfleet.plan.build import plan
from sparkfleet.plan.model import Plan
from tests.fleet.loopback import LoopbackFleet

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="openssh-server missing"),
    pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync missing"),
]

REPO = "models--acme--tiny"
REV1 = "1" * 40
REV2 = "2" * 40


def make_hf_snapshot(repo: Path, rev: str, files: dict[str, bytes], *, main: bool = True) -> Path:
    """A hub-cache repo as huggingface_hub writes it: blobs named by sha256, relative symlinks."""
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap = repo / "snapshots" / rev
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        blob = repo / "blobs" / digest
        if not blob.exists():
            blob.write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
    return repo


def model_files(shard_bytes: int = 3 << 20, shards: int = 4) -> dict[str, bytes]:
    files = {
        "config.json": b'{"model_type": "tiny", "hidden_size": 64}',
        "model.safetensors.index.json": b'{"weight_map": {"a": "model-00001-of-00004.safetensors"}}',
        "tokenizer.json": b'{"version": "1.0"}',
        "original/consolidated.pth": os.urandom(1 << 20),
    }
    for i in range(1, shards + 1):
        files[f"model-{i:05d}-of-{shards:05d}.safetensors"] = os.urandom(shard_bytes)
    return files


@dataclass
class Setup:
    fleet: LoopbackFleet
    plan: Plan
    transports: dict[str, SshTransport]
    source: Path

    def node_repo(self, i: int) -> Path:
        return self.fleet.nodes[i].hf_cache / "hub" / REPO


def build(fleet: LoopbackFleet, workdir: Path, staging: str, *, nodes: int, revision: str | None = None) -> Setup:
    cluster = load_cluster(fleet.cluster_file)
    recipe_dir = workdir / "recipe"
    recipe_dir.mkdir(exist_ok=True)
    head = 'engine = "vllm"\nmodel = "acme/tiny"\ndocker_image = "sparkfleet/test:latest"\n'
    head += f"required_nodes = {nodes}\ntensor_parallel_size = {nodes}\n"
    if revision:
        head += f'revision = "{revision}"\n'
    (recipe_dir / "recipe.toml").write_text(head + staging)
    p = plan(load_recipe(recipe_dir), cluster, "dist")
    transports = {r.node.name: SshTransport(r.node) for r in p.ranks}
    return Setup(fleet, p, transports, workdir / "src" / REPO)


def sync_toml(src: str, *, source_node: str | None = None, exclude: str = '["original/*"]') -> str:
    extra = f'source_node = "{source_node}"\n' if source_node else ""
    return (
        f'\n[[staging]]\nkind = "sync"\nid = "weights"\nsrc = "{src}"\n'
        f'dst = "{{{{hf}}}}/hub/{REPO}"\nexclude = {exclude}\n{extra}'
    )


@contextmanager
def fleet_of(n: int, workdir: Path) -> Iterator[LoopbackFleet]:
    """A loopback fleet; retried because other test runs on this machine may take the same
    addresses between the fleet's free-port check and its sshd's bind."""
    for attempt in range(3):
        try:
            fleet = LoopbackFleet(n, workdir / f"fleet{attempt}")
        except RuntimeError as exc:
            if "Address already in use" not in str(exc) or attempt == 2:
                raise
            continue
        try:
            yield fleet
        finally:
            fleet.close()
        return


@pytest.fixture
def fleet4(tmp_path: Path) -> Iterator[LoopbackFleet]:
    with fleet_of(4, tmp_path) as fleet:
        yield fleet


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_hub_layout(repo: Path, rev: str, files: dict[str, bytes], excluded: tuple[str, ...] = ()) -> None:
    snap = repo / "snapshots" / rev
    for name, data in files.items():
        link = snap / name
        if name in excluded:
            assert not link.exists() and not link.is_symlink(), f"{name} should have been excluded"
            continue
        assert link.is_symlink(), f"{link} is not a symlink"
        target = os.readlink(link)
        assert not os.path.isabs(target) and target.startswith("../../blobs/"), target
        assert link.resolve().parent == (repo / "blobs").resolve()
        assert link.read_bytes() == data


def test_first_sync_then_second_sync_moves_nothing(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    files = model_files()
    setup = build(fleet4, tmp_path, sync_toml(str(tmp_path / "src" / REPO)), nodes=4)
    make_hf_snapshot(setup.source, REV1, files)
    wanted = sum(len(d) for n, d in files.items() if not n.startswith("original/"))

    first = distribute(setup.plan, setup.transports)
    assert sorted(r.node for r in first.of(SyncReport)) == ["node0", "node1", "node2", "node3"]
    for i in range(4):
        assert_hub_layout(setup.node_repo(i), REV1, files, excluded=("original/consolidated.pth",))
        assert (setup.node_repo(i) / "refs" / "main").read_text() == REV1
    for r in first.of(SyncReport):
        assert r.method == "rsync"
        assert r.bytes_sent >= wanted  # every blob crossed the wire once per node

    second = distribute(setup.plan, setup.transports)
    for r in second.of(SyncReport):
        assert (r.files_sent, r.bytes_sent) == (0, 0), r


def test_one_changed_file_is_the_only_one_recopied(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    files = model_files()
    setup = build(fleet4, tmp_path, sync_toml(str(tmp_path / "src" / REPO)), nodes=4)
    make_hf_snapshot(setup.source, REV1, files)
    distribute(setup.plan, setup.transports)

    # A new revision that changes one shard: the hub adds one blob and a new snapshot folder.
    changed = dict(files, **{"model-00003-of-00004.safetensors": os.urandom(3 << 20)})
    make_hf_snapshot(setup.source, REV2, changed)
    report = distribute(setup.plan, setup.transports)
    for r in report.of(SyncReport):
        # the new blob and refs/main; the three unchanged shards are not sent again
        assert r.files_sent == 2, r
        assert 3 << 20 <= r.bytes_sent < (3 << 20) + 4096, r
    for i in range(4):
        assert_hub_layout(setup.node_repo(i), REV2, changed, excluded=("original/consolidated.pth",))


def _rsync_children() -> list[int]:
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = stat[stat.rindex(")") + 2 :].split()[1]
        if comm == "rsync" and ppid == me:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_interrupted_sync_resumes_from_the_partial_file(tmp_path: Path) -> None:
    size = 256 << 20
    files = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": os.urandom(size)}
    with fleet_of(1, tmp_path) as fleet:
        setup = build(fleet, tmp_path, sync_toml(str(tmp_path / "src" / REPO), exclude="[]"), nodes=1)
        make_hf_snapshot(setup.source, REV1, files)
        blobs = setup.node_repo(0) / "blobs"
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                distribute(setup.plan, setup.transports)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=run)
        worker.start()
        killed = False
        deadline = time.monotonic() + 60
        while worker.is_alive() and time.monotonic() < deadline and not killed:
            temps = [p for p in blobs.glob(".*") if p.is_file()] if blobs.is_dir() else []
            if any(p.stat().st_size > size // 4 for p in temps):
                for pid in _rsync_children():
                    os.kill(pid, signal.SIGKILL)  # a real crash of the sending rsync, mid-file
                    killed = True
            time.sleep(0.002)
        worker.join(60)
        assert killed, "the transfer finished before it could be interrupted"
        assert isinstance(outcome[0], StagingError) and "killed by signal 9" in str(outcome[0])
        partial = list(blobs.glob(".sparkfleet-partial/*"))
        assert partial and 0 < partial[0].stat().st_size < size
        kept = partial[0].stat().st_size

        report = distribute(setup.plan, setup.transports)
        (r,) = report.of(SyncReport)
        assert r.bytes_sent <= size - kept + (1 << 20), f"resumed sync sent {r.bytes_sent} of {size} bytes"
        assert (setup.node_repo(0) / "snapshots" / REV1 / "model.safetensors").read_bytes() == files[
            "model.safetensors"
        ]
        assert not list(blobs.glob(".sparkfleet-partial/*"))


def test_pinned_revision_is_synced_and_checked(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    files = model_files(shard_bytes=1 << 20)
    setup = build(fleet4, tmp_path, sync_toml(str(tmp_path / "src" / REPO)), nodes=4, revision=REV1)
    make_hf_snapshot(setup.source, REV1, files)
    make_hf_snapshot(setup.source, REV2, dict(files, **{"config.json": b"{}"}))  # main moved on
    distribute(setup.plan, setup.transports)
    for i in range(4):
        assert (setup.node_repo(i) / "snapshots" / REV1 / "config.json").read_bytes() == files["config.json"]
        assert not (setup.node_repo(i) / "snapshots" / REV2).exists()
    shutil.rmtree(setup.source / "snapshots" / REV1)  # the pin is checked where the copy comes from
    with pytest.raises(StagingError, match=rf"^controller: .*revision '{REV1}' is not in the cache"):
        distribute(setup.plan, setup.transports)


def test_sync_from_a_source_node_pushes_node_to_node(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    files = model_files(shard_bytes=1 << 20)
    setup = build(fleet4, tmp_path, sync_toml(f"{{{{hf}}}}/hub/{REPO}", source_node="node0"), nodes=4)
    make_hf_snapshot(setup.node_repo(0), REV1, files)
    report = distribute(setup.plan, setup.transports, fanout="push")
    by_node = {r.node: r for r in report.of(SyncReport)}
    assert by_node["node0"].method == "none"  # the source's own copy is the snapshot
    for i in (1, 2, 3):
        assert by_node[f"node{i}"].method == "rsync" and by_node[f"node{i}"].bytes_sent > 4 << 20
        assert_hub_layout(setup.node_repo(i), REV1, files, excluded=("original/consolidated.pth",))
    again = distribute(setup.plan, setup.transports, fanout="push")
    assert all(r.bytes_sent == 0 for r in again.of(SyncReport))


def test_a_pipeline_from_a_source_node_resends_only_what_a_node_lacks(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    files = model_files(shard_bytes=1 << 20)
    setup = build(fleet4, tmp_path, sync_toml(f"{{{{hf}}}}/hub/{REPO}", source_node="node0"), nodes=4)
    make_hf_snapshot(setup.node_repo(0), REV1, files)
    report = distribute(setup.plan, setup.transports)  # the default: node0 → node1 → node2 → node3
    by_node = {r.node: r for r in report.of(SyncReport)}
    assert by_node["node0"].method == "none"
    for i in (1, 2, 3):
        assert by_node[f"node{i}"].method == "pipeline" and by_node[f"node{i}"].bytes_sent > 4 << 20
        assert_hub_layout(setup.node_repo(i), REV1, files, excluded=("original/consolidated.pth",))
    # A copy cut half-way on node2: that one file travels again, to node2 only.
    shard = setup.node_repo(2) / "snapshots" / REV1 / "model-00003-of-00004.safetensors"
    blob = shard.resolve()
    blob.write_bytes(blob.read_bytes()[: 1 << 19])
    again = {r.node: r for r in distribute(setup.plan, setup.transports).of(SyncReport)}
    assert (again["node2"].files_sent, again["node2"].bytes_sent) == (1, 1 << 20)
    assert all(again[n].bytes_sent == 0 for n in ("node1", "node3"))
    assert_hub_layout(setup.node_repo(2), REV1, files, excluded=("original/consolidated.pth",))


def test_tar_stream_fallback_copies_the_same_tree(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    files = model_files(shard_bytes=1 << 20)
    setup = build(fleet4, tmp_path, sync_toml(str(tmp_path / "src" / REPO)), nodes=2)
    make_hf_snapshot(setup.source, REV1, files)
    first = distribute(setup.plan, setup.transports, method="tar")
    assert {r.method for r in first.of(SyncReport)} == {"tar"}
    for i in (0, 1):
        assert_hub_layout(setup.node_repo(i), REV1, files, excluded=("original/consolidated.pth",))
    again = distribute(setup.plan, setup.transports, method="tar")
    assert all(r.bytes_sent == 0 for r in again.of(SyncReport))


def test_plain_folder_one_changed_file(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    folder = tmp_path / "src" / "tables"
    folder.mkdir(parents=True)
    for i in range(5):
        (folder / f"t{i}.bin").write_bytes(os.urandom(1 << 20))
    staging = (
        f'\n[[staging]]\nkind = "sync"\nid = "tables"\nsrc = "{folder}"\ndst = "{{{{state}}}}/tables"\n'
        'include = ["t*.bin"]\n'
    )
    setup = build(fleet4, tmp_path, staging, nodes=4)
    distribute(setup.plan, setup.transports)
    # Same size, new content, an mtime in the same second as the synced copy's: rsync's default
    # quick check compares whole seconds and skipped such a file.
    before = (folder / "t3.bin").stat().st_mtime_ns
    (folder / "t3.bin").write_bytes(os.urandom(1 << 20))
    same_second = before - before % 10**9 + (before % 10**9 + 500_000_000) % 10**9
    os.utime(folder / "t3.bin", ns=(same_second, same_second))
    report = distribute(setup.plan, setup.transports)
    for r in report.of(SyncReport):
        assert r.files_sent == 1 and r.bytes_sent <= (1 << 20) + 4096, r
    for node in fleet4.nodes:
        assert sha(node.state_dir / "tables" / "t3.bin") == sha(folder / "t3.bin")


def test_a_cache_shared_by_all_nodes_is_written_once(tmp_path: Path) -> None:
    files = model_files(shard_bytes=1 << 20)
    nas = tmp_path / "nas-hf"
    fleet = LoopbackFleet(4, tmp_path / "fleet", shared_hf_cache=nas)
    try:
        setup = build(fleet, tmp_path, sync_toml(str(tmp_path / "src" / REPO)), nodes=4)
        make_hf_snapshot(setup.source, REV1, files)
        report = {r.node: r for r in distribute(setup.plan, setup.transports).of(SyncReport)}
        assert report["node0"].method == "rsync" and report["node0"].bytes_sent > 4 << 20
        for n in ("node1", "node2", "node3"):
            assert report[n].method == "shared" and report[n].bytes_sent == 0
            assert "same storage as on node0" in (report[n].note or "")
        assert_hub_layout(nas / "hub" / REPO, REV1, files, excluded=("original/consolidated.pth",))
        assert not list((nas / "hub" / REPO).glob(".sparkfleet-shared-*"))  # the probe cleaned up

        # The seed's NAS case: the source node's cache is the NAS every node mounts.
        nas_sync = sync_toml(f"{{{{hf}}}}/hub/{REPO}", source_node="node0")
        setup = build(fleet, tmp_path, nas_sync, nodes=4)
        again = distribute(setup.plan, setup.transports)
        assert {r.method for r in again.of(SyncReport)} == {"none", "shared"}
        assert sum(r.bytes_sent for r in again.of(SyncReport)) == 0
    finally:
        fleet.close()


def test_a_node_without_rsync_gets_a_tar_stream_and_says_so(tmp_path: Path) -> None:
    files = model_files(shard_bytes=1 << 20)
    fleet = LoopbackFleet(2, tmp_path / "fleet")
    try:
        # node1's sessions get a PATH holding the usual tools but no rsync (and no python: sync
        # needs none on the nodes).
        bin_dir = tmp_path / "bin-without-rsync"
        bin_dir.mkdir()
        for tool in ("sh", "bash", "mkdir", "tar", "cat", "stat", "find", "xargs", "sha256sum",
                     "sed", "test", "rm", "env", "true", "ls", "dirname", "mv", "chmod"):  # fmt: skip
            found = shutil.which(tool)
            if found:
                (bin_dir / tool).symlink_to(found)
        config = fleet.nodes[1].sshd_config
        config.write_text(
            config.read_text().replace("SetEnv SPARKFLEET_NODE=node1", f"SetEnv SPARKFLEET_NODE=node1 PATH={bin_dir}")
        )
        fleet.stop_node(1)
        fleet.start_node(1)
        assert fleet.run(1, "command -v rsync").returncode != 0

        setup = build(fleet, tmp_path, sync_toml(str(tmp_path / "src" / REPO)), nodes=2)
        make_hf_snapshot(setup.source, REV1, files)
        done = distribute(setup.plan, setup.transports)
        report = {r.node: r for r in done.of(SyncReport)}
        assert done.notes == (f"node1: {report['node1'].note}",)
        assert report["node0"].method == "rsync" and report["node0"].note is None
        assert report["node1"].method == "tar"
        assert report["node1"].note == (
            "rsync is not installed on node1: copied with a tar stream over SSH instead (whole files, no delta)"
        )
        assert_hub_layout(setup.node_repo(1), REV1, files, excluded=("original/consolidated.pth",))
        again = {r.node: r for r in distribute(setup.plan, setup.transports).of(SyncReport)}
        assert again["node1"].bytes_sent == 0
    finally:
        fleet.close()


def test_a_pipeline_down_eight_nodes(tmp_path: Path) -> None:
    # Each node runs its own small script: one command holding the rest of the chain would
    # double in size at every node and pass the kernel's limit on one argument by the sixth.
    files = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": os.urandom(64 << 10)}
    with fleet_of(8, tmp_path) as fleet:
        setup = build(fleet, tmp_path, sync_toml(f"{{{{hf}}}}/hub/{REPO}", source_node="node0"), nodes=8)
        make_hf_snapshot(setup.node_repo(0), REV1, files)
        report = distribute(setup.plan, setup.transports)
        piped = sorted(r.node for r in report.of(SyncReport) if r.method == "pipeline")
        assert piped == [f"node{i}" for i in range(1, 8)]
        for i in range(1, 8):
            assert_hub_layout(setup.node_repo(i), REV1, files)
