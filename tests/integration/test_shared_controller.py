"""A controller shared with other local users: a second user, created by the test, who makes
sparkfleet's socket folder first (or plants a symlink there) receives nothing, and every folder
and file sparkfleet keeps on the controller is private."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from tests.fleet.loopback import LoopbackFleet
from tests.integration.conftest import leftover_processes, sparkfleet, standin_recipe
from tests.integration.test_instances import _free_port

pytestmark = pytest.mark.integration

TOKEN = "hf_SharedControllerSecret0123456789abcd"


def _as(user: pwd.struct_passwd, *argv: str) -> None:
    subprocess.run(list(argv), check=True, user=user.pw_uid, group=user.pw_gid, extra_groups=[])


def _everything_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _up_through(attacker_sees: Path, sticky_tmp: Path, fleet: LoopbackFleet, tmp_path: Path) -> None:
    """up over SSH with a token, TMPDIR the shared folder: refused in one line, nothing in the
    attacker's folder, nothing left running."""
    name = "victim"
    recipe = standin_recipe(tmp_path / name, nodes=2, port=_free_port())
    env = {"TMPDIR": str(sticky_tmp), "SPARKFLEET_STATE_DIR": str(tmp_path / "state")}
    try:
        out = sparkfleet("up", str(recipe), "--cluster", str(fleet.cluster_file), "--env", f"HF_TOKEN={TOKEN}",
                         env=env)  # fmt: skip
        assert out.returncode == 2, out.stdout + out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert f"sparkfleet-ssh-{os.getuid()}" in out.stderr and "refusing" in out.stderr
        assert "internal error" not in out.stderr and TOKEN not in out.stdout + out.stderr
        assert _everything_under(attacker_sees) == []  # no master socket, no forward, no file
    finally:
        sparkfleet("down", name, env=env)
    assert leftover_processes(name) == []


def test_a_socket_folder_made_first_by_another_user_is_refused(
    fleet2: LoopbackFleet, other_user: pwd.struct_passwd, sticky_tmp: Path, tmp_path: Path
) -> None:
    trap = sticky_tmp / f"sparkfleet-ssh-{os.getuid()}"
    _as(other_user, "mkdir", "-m", "777", str(trap))
    _up_through(trap, sticky_tmp, fleet2, tmp_path)


def test_a_symlink_planted_as_the_socket_folder_is_refused(
    fleet2: LoopbackFleet, other_user: pwd.struct_passwd, sticky_tmp: Path, tmp_path: Path
) -> None:
    theirs = sticky_tmp / "mallory"
    _as(other_user, "mkdir", "-m", "777", str(theirs))
    _as(other_user, "ln", "-s", str(theirs), str(sticky_tmp / f"sparkfleet-ssh-{os.getuid()}"))
    _up_through(theirs, sticky_tmp, fleet2, tmp_path)


def test_a_state_dir_made_by_another_user_is_refused(other_user: pwd.struct_passwd, sticky_tmp: Path) -> None:
    theirs = sticky_tmp / "state"
    _as(other_user, "mkdir", "-m", "777", str(theirs))
    out = sparkfleet("status", env={"SPARKFLEET_STATE_DIR": str(theirs)})
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and str(theirs) in out.stderr, out.stderr
    assert _everything_under(theirs) == []  # no state.db for them to read


def test_state_dir_and_store_are_private(tmp_path: Path) -> None:
    state = tmp_path / "fresh" / "state"
    old_umask = os.umask(0o022)
    try:
        out = sparkfleet("status", env={"SPARKFLEET_STATE_DIR": str(state)})
    finally:
        os.umask(old_umask)
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for db in state.glob("state.db*"):
        assert stat.S_IMODE(db.stat().st_mode) == 0o600, db
    # A store an older sparkfleet left world-readable is narrowed on the next command.
    (state / "state.db").chmod(0o644)
    assert sparkfleet("status", env={"SPARKFLEET_STATE_DIR": str(state)}).returncode == 0
    assert stat.S_IMODE((state / "state.db").stat().st_mode) == 0o600
