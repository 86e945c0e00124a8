"""The node agent's session on real sshd nodes: `up` and `down` reach each node through one
agent interpreter, a failed command is raised and the session goes on, a monitor it starts is
not its child (every one that ended would linger as the agent's zombie), and a node where no
session can start gets the one-shot call and its message. Nothing of sparkfleet stays on a node
after a command but ranks and their monitors, nor in the control folder but the live masters."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from sparkfleet.config.cluster import load_cluster
from sparkfleet.errors import RankRuntimeError
from sparkfleet.nodes.agent import node_agent
from sparkfleet.nodes.agent.session import session_for
from sparkfleet.nodes.transport import transport_for
from tests.fleet.loopback import LoopbackFleet, started_on
from tests.integration.conftest import leftover_processes, sparkfleet, standin_recipe

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kinds(trace: Path) -> dict[str, Counter[str]]:
    per: dict[str, Counter[str]] = {}
    for line in trace.read_text().splitlines():
        kind, node, *_ = line.split("\t")
        per.setdefault(node, Counter())[kind] += 1
    return per


def test_up_and_down_reach_each_node_through_one_agent_session(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = standin_recipe(tmp_path / "sessions", nodes=4, port=_free_port())
    trace = tmp_path / "trace.tsv"
    env = {"SPARKFLEET_TRACE": str(trace)}
    try:
        for args in (("up", str(recipe), "--cluster", str(fleet4.cluster_file)), ("down", "sessions")):
            trace.write_text("")
            out = sparkfleet(*args, env=env)
            assert out.returncode == 0, out.stderr
            per = _kinds(trace)
            assert sorted(per) == ["node0", "node1", "node2", "node3"], per
            for node, kinds in per.items():
                # One SSH channel and one interpreter per node; every agent call went through it.
                assert (kinds["ssh-stream"], kinds["ssh"]) == (1, 0) and kinds["ssh-agent"] >= 2, (args[0], node, kinds)
    finally:
        sparkfleet("down", "sessions")
    assert leftover_processes("sessions") == []


def _spec(tmp_path: Path, node: str, argv: list[str]) -> dict[str, object]:
    work = tmp_path / "rank"
    return {"argv": argv, "env_file": str(work / "env"), "log_path": str(work / "log"),
            "pid_path": str(work / "pid"), "exit_path": str(work / "exit"), "workdir": str(work),
            "deployment": f"test-session-{os.getpid()}", "rank": 0, "node": node, "grace": 5,
            "markers": {"SPARKFLEET_INSTANCE": "feedfacecafe"}}  # fmt: skip


def test_a_monitor_started_through_a_session_is_not_the_agents_child(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    node = load_cluster(fleet4.cluster_file).nodes[1]
    transport = transport_for(node)
    spec = _spec(tmp_path, node.name, ["sleep", "60"])
    try:
        state = node_agent(transport, node.python, "start", spec, stdin=b"A=1\n")
        assert state["state"] == "running", state
        session = session_for(transport, node.python)
        assert session is not None and session.pid is not None
        monitor = int(Path(str(spec["pid_path"])).read_text().split()[0])  # it leads the rank's group
        parent = int(Path(f"/proc/{monitor}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert parent != session.pid and Path(f"/proc/{session.pid}").exists()
        # A rank whose engine ends at once: its monitor goes too, and nothing of it stays behind.
        ended = _spec(tmp_path / "second", node.name, ["sh", "-c", "exit 3"])
        node_agent(transport, node.python, "start", ended, stdin=b"")
        deadline = time.monotonic() + 20
        while node_agent(transport, node.python, "inspect", ended)["exit_code"] is None:  # its monitor wrote it
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert node_agent(transport, node.python, "inspect", ended)["exit_code"] == 3
        assert session_for(transport, node.python) is session  # all through one session
    finally:
        stopped = node_agent(transport, node.python, "stop", spec, timeout=60)["stopped"]
    assert stopped and leftover_processes(str(spec["deployment"])) == []


def test_a_failed_command_is_raised_and_the_session_goes_on(fleet4: LoopbackFleet) -> None:
    node = load_cluster(fleet4.cluster_file).nodes[2]
    transport = transport_for(node)
    assert node_agent(transport, node.python, "watch", {"ranks": []})["mem_available"] > 0
    session = session_for(transport, node.python)
    assert session is not None and session.serving  # the call above went through it
    with pytest.raises(RankRuntimeError, match=r"(?s)node agent stop failed: .*KeyError: 'pid_path'"):
        node_agent(transport, node.python, "stop", {"deployment": "x"})
    assert node_agent(transport, node.python, "watch", {"ranks": []})["mem_available"] > 0
    assert session_for(transport, node.python) is session and not session.closed


def test_a_node_where_no_session_starts_gets_the_one_shot_call_and_its_message(fleet4: LoopbackFleet) -> None:
    node = load_cluster(fleet4.cluster_file).nodes[3]
    transport = transport_for(node)
    missing = "/nonexistent/bin/python3"
    for _ in range(2):  # the second call does not try a session again
        with pytest.raises(RankRuntimeError, match=r"node agent watch failed: .*python3: (No such file|not found)"):
            node_agent(transport, missing, "watch", {"ranks": []})
    assert session_for(transport, missing) is None


def _live_master(path: Path) -> bool:
    check = ["ssh", "-o", f"ControlPath={path}", "-O", "check", "node"]
    return subprocess.run(check, capture_output=True).returncode == 0


def _strays(fleet: LoopbackFleet, deployment: str) -> list[str]:
    """What logins to the fleet's nodes left running besides the deployment's ranks (they carry
    its marker) and their monitors (each leads its rank's process group)."""
    ranks = set(leftover_processes(deployment))
    monitors = set()
    for pid in ranks:
        with contextlib.suppress(OSError):
            monitors.add(os.getpgid(pid))
    out = []
    for node in fleet.nodes:
        for pid in set(started_on(node)) - ranks - monitors:
            with contextlib.suppress(OSError):
                out.append(f"{node.name} {pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:120]!r}")
    return out


def test_nothing_of_sparkfleet_stays_on_a_node_or_in_the_control_folder(fleet4: LoopbackFleet,
                                                                          tmp_path: Path) -> None:  # fmt: skip
    # A control folder of this test's own (a short path: a unix socket's is at most 108 bytes).
    tmp = Path(tempfile.mkdtemp(prefix="sfc", dir="/tmp"))
    env = {"TMPDIR": str(tmp)}
    recipe = standin_recipe(tmp_path / "nothing-stays", nodes=4, port=_free_port())
    commands = [("up", str(recipe), "--cluster", str(fleet4.cluster_file)), ("status", "nothing-stays"),
                ("down", "nothing-stays")]  # fmt: skip
    try:
        for args in commands:
            out = sparkfleet(*args, env=env)
            assert out.returncode == 0, out.stderr
            time.sleep(1)
            assert _strays(fleet4, "nothing-stays") == [], args[0]
            if args[0] != "down":
                assert len(leftover_processes("nothing-stays")) >= 4  # its ranks (and their children)
            # Only the nodes' masters, which ControlPersist keeps for the next command.
            (control,) = tmp.iterdir()
            left = sorted(control.iterdir())
            assert 1 <= len(left) <= 4 and all(re.fullmatch(r"[0-9a-f]{32}", p.name) for p in left), left
            assert all(_live_master(p) for p in left), left
    finally:
        sparkfleet("down", "nothing-stays", env=env)
        for master in tmp.glob("*/*"):
            subprocess.run(["ssh", "-o", f"ControlPath={master}", "-O", "exit", "node"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    assert leftover_processes("nothing-stays") == []
