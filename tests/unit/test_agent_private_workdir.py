"""The node agent starts a rank only in a folder of this user: a symlink or a file planted where a
rank's workdir goes (where its env file, with every secret, is written) is refused before anything
is written or started; this user's own folder left open to others is narrowed to 0700."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkfleet.nodes.shipped import agent


def _spec(workdir: Path) -> dict[str, object]:
    return {"argv": ["sleep", "60"], "env_file": str(workdir / "r0.env"), "log_path": str(workdir / "r0.log"),
            "pid_path": str(workdir / "r0.pid"), "exit_path": str(workdir / "r0.exit"), "workdir": str(workdir),
            "deployment": f"test-private-{os.getpid()}", "rank": 0, "node": "local", "grace": 1,
            "markers": {}}  # fmt: skip


@pytest.mark.parametrize("planted", ["symlink", "file"])
def test_a_planted_workdir_is_refused_and_no_secret_is_written(tmp_path: Path, planted: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workdir = tmp_path / "deployments" / "dep"
    workdir.parent.mkdir()
    if planted == "symlink":
        workdir.symlink_to(elsewhere)
    else:
        workdir.write_text("")
    with pytest.raises((PermissionError, FileExistsError), match="dep"):
        agent.start(_spec(workdir), b"HF_TOKEN=hf_secret\n")
    assert list(elsewhere.iterdir()) == []  # the env file went nowhere


def test_this_users_open_workdir_is_narrowed_to_private(tmp_path: Path) -> None:
    workdir = tmp_path / "dep"
    workdir.mkdir(mode=0o755)
    os.chmod(workdir, 0o755)
    agent._private_dir(str(workdir))
    assert workdir.stat().st_mode & 0o777 == 0o700
