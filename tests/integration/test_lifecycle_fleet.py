"""up / status / logs / down on a 4-node loopback fleet (real sshd per node), with real faults.

After every test no process of the deployment is left on any node."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fleet.loopback import LoopbackFleet
from tests.integration.conftest import leftover_processes, sparkfleet, standin_recipe

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_up_status_logs_down(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = standin_recipe(tmp_path / "four", nodes=4, port=free_port(), verify='expect = ["fired up"]')
    up = sparkfleet("up", str(recipe), "--cluster", str(fleet4.cluster_file))
    assert up.returncode == 0, up.stderr
    assert "ready" in up.stdout and "42" in up.stdout
    status = sparkfleet("status", "four", "--json")
    assert status.returncode == 0, status.stderr
    ranks = json.loads(status.stdout)[0]["ranks"]
    assert [(r["rank"], r["node"], r["state"]) for r in ranks] == [
        (0, "node0", "running"),
        (1, "node1", "running"),
        (2, "node2", "running"),
        (3, "node3", "running"),
    ]
    assert ranks[0]["health"] == "healthy"
    logs = sparkfleet("logs", "four")
    for r in range(4):
        assert f"r{r} node{r} | standin rank {r}" in logs.stdout
    one = sparkfleet("logs", "four", "--rank", "2")
    assert "r2 node2" in one.stdout and "r0 node0" not in one.stdout
    again = sparkfleet("up", str(recipe), "--cluster", str(fleet4.cluster_file))
    assert again.returncode == 2 and "already ready" in again.stderr
    assert len(leftover_processes("four")) >= 4
    down = sparkfleet("down", "four")
    assert down.returncode == 0, down.stderr
    assert leftover_processes("four") == []
    assert sparkfleet("down", "four").returncode == 0  # idempotent


def test_rank_exit_during_up_rolls_back_everywhere(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = standin_recipe(
        tmp_path / "crash",
        nodes=4,
        port=free_port(),
        env={"STANDIN_FAULT_RANK": "2", "STANDIN_EXIT": "3", "STANDIN_HEAD_DELAY": "5"},
    )
    out = sparkfleet("up", str(recipe), "--cluster", str(fleet4.cluster_file))
    assert out.returncode == 2
    assert "rank 2 on node2 exited with code 3" in out.stderr
    assert "standin: simulated failure" in out.stderr  # the rank's last log lines are shown
    assert leftover_processes("crash") == []
    assert json.loads(sparkfleet("status", "crash", "--json").stdout)[0]["status"] == "failed"


def test_rank_killed_during_up_rolls_back(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = standin_recipe(
        tmp_path / "killed", nodes=4, port=free_port(), env={"STANDIN_FAULT_RANK": "0", "STANDIN_DELAY": "120"}
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkfleet.cli.main", "up", str(recipe), "--cluster", str(fleet4.cluster_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    victim = None
    deadline = time.monotonic() + 90
    while victim is None and time.monotonic() < deadline:
        for pid in leftover_processes("killed"):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"SPARKFLEET_RANK=1" in environ and b"standin_engine" in cmdline:
                victim = pid
        time.sleep(0.1)
    assert victim is not None, "rank 1 never started"
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "rank 1 on node1 exited" in err
    assert leftover_processes("killed") == []


def test_unreachable_node_is_named_and_nothing_starts(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = standin_recipe(tmp_path / "dark", nodes=4, port=free_port())
    fleet4.stop_node(2)
    out = sparkfleet("up", str(recipe), "--cluster", str(fleet4.cluster_file))
    assert out.returncode == 2
    assert "node2: cannot reach" in out.stderr and fleet4.nodes[2].host in out.stderr
    assert leftover_processes("dark") == []


def test_readiness_timeout_rolls_back(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = standin_recipe(
        tmp_path / "slow", nodes=4, port=free_port(), env={"STANDIN_FAULT_RANK": "0", "STANDIN_DELAY": "60"}
    )
    out = sparkfleet("up", str(recipe), "--cluster", str(fleet4.cluster_file), "--timeout", "3")
    assert out.returncode == 2
    assert "slow not ready after 3s: still waiting for rank 0 health" in out.stderr
    assert leftover_processes("slow") == []


def test_forbidden_boot_line_rolls_back(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = standin_recipe(tmp_path / "bad", nodes=4, port=free_port(),
                            env={"STANDIN_FAULT_RANK": "3", "STANDIN_LOG_LINE": "hc_fused MISMATCH at layer 7"},
                            verify='forbid = ["MISMATCH"]')  # fmt: skip
    out = sparkfleet("up", str(recipe), "--cluster", str(fleet4.cluster_file))
    assert out.returncode == 2
    assert "rank 3 on node3: forbidden boot-log line 'MISMATCH' appeared" in out.stderr
    assert "hc_fused MISMATCH at layer 7" in out.stderr
    assert leftover_processes("bad") == []


def test_missing_expected_line_is_named(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = standin_recipe(tmp_path / "quiet", nodes=2, port=free_port(),
                            verify='expect = ["RoCEnante ready"]')  # fmt: skip
    out = sparkfleet("up", str(recipe), "--cluster", str(fleet4.cluster_file), "--timeout", "3")
    assert out.returncode == 2 and "log lines ['RoCEnante ready']" in out.stderr
    assert leftover_processes("quiet") == []


@pytest.mark.parametrize("how", ["ctrl-c-to-the-terminal-group", "sigterm"])
def test_interrupt_during_up_rolls_back(fleet4: LoopbackFleet, tmp_path: Path, how: str) -> None:
    recipe = standin_recipe(
        tmp_path / "intr", nodes=4, port=free_port(), env={"STANDIN_FAULT_RANK": "0", "STANDIN_DELAY": "300"}
    )
    # Its own process group, like a shell job: Ctrl-C at a terminal reaches the whole group
    # (sparkfleet and every ssh it runs), SIGTERM only sparkfleet.
    proc = subprocess.Popen([sys.executable, "-m", "sparkfleet.cli.main", "up", str(recipe), "--cluster",
                             str(fleet4.cluster_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            process_group=0)  # fmt: skip
    deadline = time.monotonic() + 90
    while len(leftover_processes("intr")) < 4 and time.monotonic() < deadline:  # one engine per rank
        time.sleep(0.1)
    assert len(leftover_processes("intr")) >= 4, "the ranks never started"
    time.sleep(3)  # up is now waiting for rank 0's health: the Ctrl-C a user gives a slow start
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: intr: every started rank was stopped" in err
    assert leftover_processes("intr") == []


def test_down_finds_ranks_after_local_state_is_lost(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = standin_recipe(tmp_path / "lost", nodes=4, port=free_port())
    assert sparkfleet("up", str(recipe), "--cluster", str(fleet4.cluster_file)).returncode == 0
    try:
        other_state = {"SPARKFLEET_STATE_DIR": str(tmp_path / "fresh-state")}
        refused = sparkfleet("down", "lost", env=other_state)
        assert refused.returncode == 2 and "down lost --sweep --cluster FILE" in refused.stderr
        assert len(leftover_processes("lost")) >= 4  # a controller without the record stops nothing by name
        out = sparkfleet("down", "lost", "--sweep", "--cluster", str(fleet4.cluster_file), env=other_state)
        assert out.returncode == 0, out.stderr
        # The sweep lists what it found, whose it is, then stops it.
        assert "found 4 rank(s) of 'lost'" in out.stdout
        assert "node3: pid" in out.stdout and "rank 3, running; instance" in out.stdout
        assert f"owner root@{socket.gethostname()}:" in out.stdout
    finally:
        sparkfleet("down", "lost")  # the controller that started it, should the sweep have failed
    assert leftover_processes("lost") == []


def test_status_and_logs_reach_every_node_in_parallel(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = standin_recipe(tmp_path / "par", nodes=4, port=free_port())
    assert sparkfleet("up", str(recipe), "--cluster", str(fleet4.cluster_file)).returncode == 0
    try:
        fleet4.stop_node(3)  # the node's sshd goes away; its rank keeps running
        status = sparkfleet("status", "par", "--json")
        ranks = json.loads(status.stdout)[0]["ranks"]
        assert ranks[3]["state"] == "unknown" and "node3: cannot reach" in ranks[3]["detail"]
        assert [r["state"] for r in ranks[:3]] == ["running"] * 3
    finally:
        fleet4.start_node(3)
        assert sparkfleet("down", "par").returncode == 0
    assert leftover_processes("par") == []


def test_up_pushes_copy_files_to_every_node_and_a_failed_push_stops_the_launch(
    fleet4: LoopbackFleet, tmp_path: Path
) -> None:
    table = tmp_path / "dspark-tables.json"
    table.write_text('{"k7": [1, 2, 3]}\n')
    staging = f'\n[[staging]]\nkind = "copy"\nid = "tables"\nfiles = ["{table}"]\ndst = "{{{{state}}}}/tables"\n'
    recipe = standin_recipe(tmp_path / "tables", nodes=4, port=free_port())
    (recipe / "recipe.toml").write_text((recipe / "recipe.toml").read_text() + staging)
    out = sparkfleet("up", str(recipe), "--cluster", str(fleet4.cluster_file))
    assert out.returncode == 0, out.stderr
    for node in fleet4.nodes:
        assert (node.state_dir / "tables" / "dspark-tables.json").read_bytes() == table.read_bytes()
    assert sparkfleet("down", "tables").returncode == 0

    missing = tmp_path / "gone.json"
    (recipe / "recipe.toml").write_text((recipe / "recipe.toml").read_text().replace(str(table), str(missing)))
    out = sparkfleet("up", str(recipe), "--cluster", str(fleet4.cluster_file))
    assert out.returncode == 2 and "gone.json" in out.stderr
    assert leftover_processes("tables") == []
