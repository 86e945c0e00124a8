"""Docker probes on captured outputs of this machine's docker (daemon up and down)."""

from __future__ import annotations

from pathlib import Path

from sparkfleet.doctor.probes import docker, snapshot
from sparkfleet.nodes.transport.local import LocalTransport
from tests.unit._captures import vm


def test_version_with_the_daemon_up() -> None:
    facts = docker.parse_version(vm("docker-version.json"), 0)
    assert facts.reachable and (facts.client, facts.server) == ("28.2.2", "20.10.24+dfsg1")


def test_version_with_the_daemon_down_names_the_reason() -> None:
    rc = int(vm("docker-version-daemon-down.rc"))
    facts = docker.parse_version(vm("docker-version-daemon-down.stdout"), rc, vm("docker-version-daemon-down.stderr"))
    assert rc == 1 and facts.installed and not facts.reachable
    assert facts.client == "28.2.2"
    assert "Cannot connect to the Docker daemon" in facts.error


def test_docker_not_installed() -> None:
    facts = docker.parse_version("", 127, "sh: 1: docker: not found")
    assert not facts.installed and not facts.reachable


def test_image_inspect_present_and_missing() -> None:
    present = docker.parse_image("sparkfleet-test:latest", vm("docker-image-inspect.json"), 0)
    assert present.present and present.id.startswith("sha256:") and len(present.id) == 71
    missing = docker.parse_image("nope:latest", "[]\n", 1)
    assert not missing.present


def test_snapshot_probe_lists_files_through_symlinks(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    repo = hf / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "aaa").write_bytes(b"x" * 10)
    (repo / "blobs" / "bbb").write_bytes(b"{}")
    snap = repo / "snapshots" / "rev1"
    (snap / "sub").mkdir(parents=True)
    (snap / "model.safetensors").symlink_to(repo / "blobs" / "aaa")
    (snap / "sub" / "config.json").symlink_to(repo / "blobs" / "bbb")
    out = LocalTransport().run(snapshot.command(str(hf), "org/tiny")).stdout
    snaps = snapshot.parse(out)
    assert [(s.revision, s.files) for s in snaps] == [("rev1", (("model.safetensors", 10), ("sub/config.json", 2)))]
    assert snapshot.parse(LocalTransport().run(snapshot.command(str(hf), "org/absent")).stdout) == ()
