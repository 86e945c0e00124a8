"""The state store shared by every sparkfleet command of a user: readers never wait for a writer,
and a store that stays locked or a disk that is full is one line, exit 2 — with real SQLite
locks held by another process and a real full filesystem (a tmpfs in the test's own mount
namespace)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.integration.conftest import leftover_processes, sparkfleet, standin_recipe
from tests.integration.test_instances import _free_port

pytestmark = pytest.mark.integration


def test_reads_do_not_wait_for_a_writer_and_a_locked_store_is_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {"SPARKFLEET_STATE_DIR": str(state)}
    assert sparkfleet("status", env=env).returncode == 0  # the store exists
    # Another sparkfleet in the middle of a long write: the write lock held.
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sqlite3, sys, time
        db = sqlite3.connect({str(state / "state.db")!r}, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO events (name, time, kind, message) VALUES ('x', 0, 'x', 'x')")
        print("held", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        status = sparkfleet("status", env=env, timeout=60)
        assert status.returncode == 0, status.stderr
        assert time.monotonic() - start < 10  # no wait on the writer's lock
        recipe = standin_recipe(tmp_path / "locked", nodes=1, port=_free_port())
        up = sparkfleet("up", str(recipe), env=env, timeout=120)
        assert up.returncode == 2, up.stdout + up.stderr
        assert "is locked by another sparkfleet command" in up.stderr and "internal error" not in up.stderr
        assert up.stderr.count("error:") == 1
    finally:
        holder.kill()
        holder.wait()
    assert leftover_processes("locked") == []


def test_a_full_disk_is_one_line(tmp_path: Path) -> None:
    if os.getuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a tmpfs in a mount namespace of the test's own needs root")
    recipe = standin_recipe(tmp_path / "full", nodes=1, port=_free_port())
    disk = tmp_path / "disk"
    disk.mkdir()
    cli = f"{sys.executable} -m sparkfleet.cli.main"
    script = f"""
        set -u
        mount -t tmpfs -o size=1m tmpfs {disk}
        export SPARKFLEET_STATE_DIR={disk}/state
        {cli} status >/dev/null || exit 90
        dd if=/dev/zero of={disk}/fill bs=4k 2>/dev/null
        {cli} up {recipe}
        echo "rc=$?"
    """
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, timeout=180, env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    assert "rc=2" in out.stdout, out.stdout + out.stderr
    assert "the disk is full" in out.stderr and "internal error" not in out.stderr, out.stderr
    assert leftover_processes("full") == []
