"""Seed 002's composed model, end to end: `up` builds the per-node directory (snapshot symlinked,
local files hard-linked over it) and the container sees, at the mount path, the snapshot's files
through their links and the local file in place of the snapshot's."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import leftover_containers, needs_docker, sparkfleet

pytestmark = [pytest.mark.integration, needs_docker]


def _blob(hub_repo: Path, rev: str, name: str, data: bytes) -> None:
    sha = hashlib.sha256(data).hexdigest()
    (hub_repo / "blobs").mkdir(parents=True, exist_ok=True)
    (hub_repo / "blobs" / sha).write_bytes(data)
    link = hub_repo / "snapshots" / rev / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(hub_repo / "blobs" / sha, link.parent))


def test_composed_model_resolves_inside_the_container(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    repo = hf / "hub" / "models--org--m"
    rev = "a" * 40
    _blob(repo, rev, "config.json", b'{"model_type": "demo"}\n')
    _blob(repo, rev, "model-00002-of-00002.safetensors", b"NAS copy: all rows\n")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    local = tmp_path / "engram-local" / "model-00002-of-00002.safetensors"
    local.parent.mkdir()
    local.write_bytes(b"node-local copy: this rank's rows only\n")
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(
        f'name = "one"\n[defaults]\nhf_cache = "{hf}"\nstate_dir = "{tmp_path / "state"}"\ngpus = "none"\n'
        'memlock = "none"\nrdma = false\n[[nodes]]\nname = "here"\nhost = "localhost"\ntransport = "local"\n'
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recipe = tmp_path / "composed"
    recipe.mkdir()
    (recipe / "recipe.toml").write_text(
        f'engine = "vllm"\nmodel = "org/m"\ndocker_image = "sparkfleet-test:latest"\nport = {port}\n'
        'entrypoint = ["standin-rank"]\n'
        f'[composed_model]\nmount = "/model"\ndir = "{tmp_path / "composed-dir"}"\n'
        '[[composed_model.sources]]\nrepo = "org/m"\n'
        f'[[composed_model.local_files]]\nhost = "{local}"\n'
    )
    up = sparkfleet("up", str(recipe), "--cluster", str(cluster))
    try:
        assert up.returncode == 0, up.stderr

        def in_container(*argv: str) -> str:
            return subprocess.run(["docker", "exec", "sparkfleet-composed-r0", *argv], capture_output=True,
                                  text=True, check=True).stdout  # fmt: skip

        assert in_container("cat", "/model/config.json") == '{"model_type": "demo"}\n'
        assert in_container("cat", "/model/model-00002-of-00002.safetensors") == local.read_text()
        composed = tmp_path / "composed-dir" / "model" / "model-00002-of-00002.safetensors"
        assert os.path.samefile(composed, local) and not composed.is_symlink()  # hard link: no extra disk
        assert (tmp_path / "composed-dir" / "model" / "config.json").is_symlink()
    finally:
        sparkfleet("down", "composed")
    assert leftover_containers("composed") == []
