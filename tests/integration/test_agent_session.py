"""The process agent's session on real sshd nodes: `up` and `down` reach each node through one
agent interpreter, a failed command is raised and the session goes on, a monitor it starts is
not its child (every one that ended would linger as the agent's zombie), and a node where no
session can start gets the one-shot call and its message. Later commands reach each node's
resident agent through the ssh master's forward, with no SSH session or interpreter started
there; a resident that is gone is replaced, and one left idle or without its socket exits."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from sparkfleet.errors import RankRuntimeError
from sparkfleet.nodes.runtime.agent_session import session_for
from sparkfleet.nodes.runtime.process import node_agent
from sparkfleet.nodes.ship import PROCESS_AGENT, shipped_argv
from sparkfleet.nodes.transport import transport_for
from sparkfleet.spec.cluster import load_cluster
from tests.fleet.loopback import LoopbackFleet, residents
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
        session = session_for(transport, node.python, open_one=False)
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
        assert session_for(transport, node.python, open_one=False) is session  # all through one session
    finally:
        stopped = node_agent(transport, node.python, "stop", spec, timeout=60)["stopped"]
    assert stopped and leftover_processes(str(spec["deployment"])) == []


def test_a_failed_command_is_raised_and_the_session_goes_on(fleet4: LoopbackFleet) -> None:
    node = load_cluster(fleet4.cluster_file).nodes[2]
    transport = transport_for(node)
    assert node_agent(transport, node.python, "watch", {"ranks": []})["mem_available"] > 0
    session = session_for(transport, node.python, open_one=False)
    assert session is not None
    with pytest.raises(RankRuntimeError, match=r"(?s)process agent stop failed: .*KeyError: 'pid_path'"):
        node_agent(transport, node.python, "stop", {"deployment": "x"})
    assert node_agent(transport, node.python, "watch", {"ranks": []})["mem_available"] > 0
    assert session_for(transport, node.python, open_one=False) is session and not session.closed


def test_a_node_where_no_session_starts_gets_the_one_shot_call_and_its_message(fleet4: LoopbackFleet) -> None:
    node = load_cluster(fleet4.cluster_file).nodes[3]
    transport = transport_for(node)
    missing = "/nonexistent/bin/python3"
    for _ in range(2):  # the second call does not try a session again
        with pytest.raises(RankRuntimeError, match=r"process agent watch failed: .*python3: (No such file|not found)"):
            node_agent(transport, missing, "watch", {"ranks": []})
    assert session_for(transport, missing, open_one=False) is None


def _sessions_started(fleet: LoopbackFleet) -> list[int]:
    """Per node, how many SSH sessions its sshd has started so far (its log)."""
    return [node.log_file.read_text().count("Starting session:") for node in fleet.nodes]


def test_later_commands_reach_each_node_through_its_resident_agent(fleet4: LoopbackFleet, tmp_path: Path) -> None:
    recipe = standin_recipe(tmp_path / "resident", nodes=4, port=_free_port())
    trace = tmp_path / "trace.tsv"
    env = {"SPARKFLEET_TRACE": str(trace)}
    up = ("up", str(recipe), "--cluster", str(fleet4.cluster_file))
    try:
        for args in (up, ("down", "resident")):  # the first contact: sessions, which start the residents
            assert sparkfleet(*args, env=env).returncode == 0
        agents = [residents(node) for node in fleet4.nodes]
        assert all(len(a) == 1 for a in agents), agents
        before = _sessions_started(fleet4)
        for args in (up, ("down", "resident")):
            trace.write_text("")
            out = sparkfleet(*args, env=env)
            assert out.returncode == 0, out.stderr
            streams = [line.split("\t") for line in trace.read_text().splitlines() if line.startswith("ssh-stream")]
            assert sorted(node for _, node, *_ in streams) == ["node0", "node1", "node2", "node3"]
            assert all(what.startswith("resident agent") for *_, what in streams), streams
        # Not one SSH session (a shell and an interpreter on the node) for up and down.
        assert _sessions_started(fleet4) == before
        assert [residents(node) for node in fleet4.nodes] == agents  # the same residents served both
    finally:
        sparkfleet("down", "resident")
    assert leftover_processes("resident") == []


def test_a_resident_agent_that_is_gone_is_replaced_and_the_call_still_answers(fleet4: LoopbackFleet) -> None:
    node = load_cluster(fleet4.cluster_file).nodes[2]
    assert node_agent(transport_for(node), node.python, "watch", {"ranks": []})["mem_available"] > 0
    (first,) = residents(fleet4.nodes[2])
    os.kill(first, 9)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{first}").exists() and Path(f"/proc/{first}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # A new command's session finds the forward dead, falls back to a session, which starts another.
    assert node_agent(transport_for(node), node.python, "watch", {"ranks": []})["mem_available"] > 0
    deadline = time.monotonic() + 10
    while not residents(fleet4.nodes[2]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (second,) = residents(fleet4.nodes[2])
    assert second != first
    before = _sessions_started(fleet4)
    assert node_agent(transport_for(node), node.python, "watch", {"ranks": []})["mem_available"] > 0
    assert _sessions_started(fleet4) == before  # the new one serves the next command


def _start_local_resident(home: Path, key: str, idle: float) -> tuple[Path, int]:
    """A session of the shipped agent on this machine (HOME=home) that starts a resident for key;
    the resident's socket and pid."""
    argv = shipped_argv(sys.executable, PROCESS_AGENT, ["serve", key, str(idle)])
    out = subprocess.run(argv, input=b"", capture_output=True, env={**os.environ, "HOME": str(home)}, timeout=30)
    hello = out.stdout.decode().splitlines()[0]
    sock = home / ".cache" / "sparkfleet" / "agents" / key
    assert f'"resident": "{sock}"' in hello, hello
    deadline = time.monotonic() + 10
    while True:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _comm(p) == "sparkfleet-res"
                and _has_home(p, home)]  # fmt: skip
        if pids and sock.exists():
            return sock, pids[0]
        assert time.monotonic() < deadline, "no resident agent came up"
        time.sleep(0.05)


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _has_home(pid: str, home: Path) -> bool:
    try:
        return f"HOME={home}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_a_resident_agent_exits_when_idle_or_when_its_socket_is_removed() -> None:
    # A short home: pytest's tmp_path would make the socket's path longer than a unix socket's.
    home = Path(tempfile.mkdtemp(prefix="sfres"))
    sock, pid = _start_local_resident(home, "a1b2c3idle", idle=1.0)
    assert (sock.parent.stat().st_mode & 0o777) == 0o700  # nobody else may reach or swap it
    assert _gone(pid, within=15) and not sock.exists()
    sock, pid = _start_local_resident(home, "a1b2c3sock", idle=300.0)
    sock.unlink()  # a home cleaned, or a newer resident's socket in its place
    assert _gone(pid, within=10)
    shutil.rmtree(home)


def test_no_resident_agent_where_its_socket_path_would_be_too_long(tmp_path: Path) -> None:
    home = tmp_path / ("h" * 80)
    home.mkdir()
    argv = shipped_argv(sys.executable, PROCESS_AGENT, ["serve", "a1b2c3long", "300"])
    out = subprocess.run(argv, input=b"", capture_output=True, env={**os.environ, "HOME": str(home)}, timeout=30)
    assert out.stdout.decode().splitlines()[0].endswith('"resident": null}')  # sessions as before


def test_forward_sockets_left_by_exited_masters_are_swept_and_live_ones_kept() -> None:
    from sparkfleet.nodes.transport import ssh

    tag = f"sweeptest{os.getpid()}"
    dead, live = ssh.control_dir() / f"{tag}dead.agent", ssh.control_dir() / f"{tag}live.agent"
    gone = socket.socket(socket.AF_UNIX)
    gone.bind(str(dead))
    gone.close()  # its file stays, as ssh leaves a forward's socket when the master exits
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(live))
    listener.listen(1)
    try:
        old = time.time() - ssh.PERSIST_S - 60
        for path in (dead, live):
            os.utime(path, (old, old))
        ssh._sweep_dead_forwards()
        assert not dead.exists() and live.exists()
    finally:
        listener.close()
        for path in (dead, live):
            path.unlink(missing_ok=True)
