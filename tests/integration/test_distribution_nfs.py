"""``nfs`` staging: worker Docker volumes (real dockerd), the export (real exportfs), and the whole
path on the loopback fleet where this kernel can run an NFS server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkfleet.apply.staging import nfs
from sparkfleet.apply.staging.phase import distribute
from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.errors import StagingError
from sparkfleet.nodes.nfs import EXPORTS_DIR
from sparkfleet.nodes.runtime import docker
from sparkfleet.nodes.transport.local import LocalTransport
from sparkfleet.nodes.transport.ssh import SshTransport
from sparkfleet.plan.build import plan
from sparkfleet.plan.staging import nfs as rules
from tests.fleet.loopback import LoopbackFleet

pytestmark = pytest.mark.integration


def _docker_ok() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def _image() -> str | None:
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True)
    names = out.stdout.split()
    return next((n for n in ("sparkfleet-test:latest", "alpine:latest", "busybox:latest") if n in names), None)


def _nfs_unavailable() -> str | None:
    """Why this machine cannot serve and mount NFS, or None when it can."""
    if shutil.which("exportfs") is None and not os.path.exists("/usr/sbin/exportfs"):
        return "nfs-kernel-server is not installed (no exportfs): run scripts/setup-nfs.sh"
    filesystems = Path("/proc/filesystems").read_text()
    if "nfsd" not in filesystems and not os.path.exists("/proc/fs/nfsd/threads"):
        probe = subprocess.run(
            ["mount", "-t", "nfsd", "nfsd", "/proc/fs/nfsd"], capture_output=True, text=True, timeout=30
        )
        if probe.returncode != 0:
            first = probe.stderr.strip().splitlines()[0] if probe.stderr.strip() else f"exit {probe.returncode}"
            return (
                f"the kernel does not allow an NFS server here: 'nfsd' is not in /proc/filesystems and "
                f"`mount -t nfsd nfsd /proc/fs/nfsd` fails ({first})"
            )
    if "\tnfs" not in filesystems and "nfs4" not in filesystems:
        return "the kernel has no NFS client ('nfs'/'nfs4' not in /proc/filesystems): Docker cannot mount the volume"
    return None


needs_docker = pytest.mark.skipif(not _docker_ok(), reason="dockerd not reachable")


def test_worker_volume_uses_the_seed_options() -> None:
    argv = docker.volume_create_argv("dsv41-weights", rules.volume_opts("10.0.22.1", "/export/dsv41", None))
    assert argv == [
        "docker", "volume", "create", "--driver", "local", "--opt", "type=nfs",
        "--opt", "o=addr=10.0.22.1,nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600",
        "--opt", "device=:/export/dsv41", "dsv41-weights",
    ]  # fmt: skip
    # A recipe's own options replace the seed's, but the share stays read-only.
    assert rules.mount_options("10.0.0.1", "nfsvers=4.1,rw,hard") == "addr=10.0.0.1,nfsvers=4.1,hard,ro"
    line = rules.exports_line("/export/dsv41", ["10.0.0.2", "10.0.0.3"], "v")
    assert line.startswith("/export/dsv41 10.0.0.2(ro,sync,no_subtree_check,no_root_squash,insecure,fsid=")
    assert " 10.0.0.3(ro," in line


@needs_docker
def test_worker_volume_is_created_kept_and_replaced_when_the_export_moves(tmp_path: Path) -> None:
    node = LocalTransport("node1")
    volume = f"sparkfleet-test-{os.getpid()}-weights"
    try:
        made = nfs.ensure_volume(node, volume, "10.0.22.1", "/export/a", None)
        assert "10.0.22.1:/export/a" in made.detail
        again = nfs.ensure_volume(node, volume, "10.0.22.1", "/export/a", None)
        assert again.detail == "volume already points at the export"
        moved = nfs.ensure_volume(node, volume, "10.0.22.1", "/export/b", None)
        assert "/export/b" in moved.detail
        seen = subprocess.run(
            ["docker", "volume", "inspect", "--format", "{{json .Options}}", volume],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        options = json.loads(seen.stdout)
        assert options["device"] == ":/export/b" and options["type"] == "nfs"
        assert options["o"].startswith("addr=10.0.22.1,") and ",ro," in options["o"]
    finally:
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)


@needs_docker
def test_a_worker_that_cannot_read_the_share_is_refused_before_launch() -> None:
    image = _image()
    if image is None:
        pytest.skip("no small local image (scripts/setup-system.sh builds sparkfleet-test)")
    node = LocalTransport("node2")
    volume = f"sparkfleet-test-{os.getpid()}-unreachable"
    try:
        # TEST-NET-1 address: nothing serves NFS there, so the container cannot mount the volume.
        nfs.ensure_volume(node, volume, "192.0.2.1", "/export/model", "nfsvers=4.2,ro,soft,timeo=10,retrans=1")
        with pytest.raises(StagingError, match=r"^node2: cannot read config.json through NFS volume"):
            nfs.check_volume(node, volume, image, "config.json")
    finally:
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="writing /etc/exports.d needs root")
def test_an_export_nobody_serves_is_refused(tmp_path: Path) -> None:
    if os.path.exists("/proc/fs/nfsd/threads") and Path("/proc/fs/nfsd/threads").read_text().strip() != "0":
        pytest.skip("an NFS server is running here")
    if shutil.which("exportfs") is None and not os.path.exists("/usr/sbin/exportfs"):
        pytest.skip("nfs-kernel-server is not installed (no exportfs): run scripts/setup-nfs.sh")
    (tmp_path / "model").mkdir()
    with pytest.raises(StagingError, match=r"^node0: cannot export .*the NFS server is not running"):
        nfs.export(LocalTransport("node0"), str(tmp_path / "model"), ["127.0.0.11"], "sparkfleet-test-v")


def test_nfs_share_read_from_a_container_on_every_worker(tmp_path: Path) -> None:
    reason = _nfs_unavailable()
    if reason is not None:
        pytest.skip(reason)
    if not _docker_ok() or _image() is None:
        pytest.skip("dockerd or a small local image is missing")
    threads = Path("/proc/fs/nfsd/threads")
    was_serving = threads.exists() and threads.read_text().strip() != "0"
    # scripts/setup-nfs.sh leaves the server stopped; a start that fails shows in distribute() below.
    subprocess.run(["service", "nfs-kernel-server", "start"], capture_output=True, timeout=120)
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text('{"model_type": "tiny"}')
    fleet = LoopbackFleet(3, tmp_path / "fleet")
    try:
        recipe = tmp_path / "recipe"
        recipe.mkdir()
        (recipe / "recipe.toml").write_text(
            f'engine = "vllm"\nmodel = "acme/tiny"\ndocker_image = "{_image()}"\n'
            "required_nodes = 3\ntensor_parallel_size = 3\n"
            f'[[staging]]\nkind = "nfs"\nid = "weights"\nsrc = "{export}"\ndst = "/models/tiny"\n'
            'server_node = "node0"\ncheck_file = "config.json"\n'
        )
        p = plan(load_recipe(recipe), load_cluster(fleet.cluster_file), "nfs-test")
        transports = {r.node.name: SshTransport(r.node) for r in p.ranks}
        report = distribute(p, transports)
        assert [r.role for r in report.of(nfs.NfsReport)] == ["server", "client", "client"]
    finally:
        fleet.close()
        subprocess.run(["docker", "volume", "rm", "-f", nfs.volume_name("nfs-test", "weights")], capture_output=True)
        Path(f"{EXPORTS_DIR}/{nfs.volume_name('nfs-test', 'weights')}.exports").unlink(missing_ok=True)
        subprocess.run(["exportfs", "-ra"], capture_output=True)
        if not was_serving:  # as found: test_an_export_nobody_serves_is_refused needs it stopped
            subprocess.run(["service", "nfs-kernel-server", "stop"], capture_output=True, timeout=120)


def test_ranks_mount_the_export_on_the_server_and_the_volume_elsewhere(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(
        'name = "c"\n' + "".join(f'[[nodes]]\nname = "n{i}"\nhost = "10.0.0.{i + 1}"\n' for i in range(3))
    )
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        'engine = "vllm"\nmodel = "/models/tiny"\ndocker_image = "img:1"\n'
        "required_nodes = 3\ntensor_parallel_size = 3\n"
        '[[staging]]\nkind = "nfs"\nid = "weights"\nsrc = "{{home}}/models/tiny"\ndst = "/models/tiny"\n'
        'server_node = "n1"\n'
    )
    p = plan(load_recipe(recipe), load_cluster(cluster), "demo")
    volume = nfs.volume_name("demo", "weights")
    by_rank = {r.rank: {m.container: m for m in r.mounts} for r in p.ranks}
    assert by_rank[1]["/models/tiny"].host == f"{p.ranks[1].node.home}/models/tiny"
    for rank in (0, 2):
        assert by_rank[rank]["/models/tiny"].host == volume
        assert by_rank[rank]["/models/tiny"].read_only
        argv = p.ranks[rank].container_argv or ()
        assert f"{volume}:/models/tiny:ro" in argv
        assert "/models/tiny:/models/tiny:ro" not in argv  # no bind of a path the worker lacks
