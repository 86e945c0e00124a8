"""watch, the restart policy and down's proof on a 2-node loopback fleet (real sshd per node)
with stand-in engines and real faults: a rank SIGKILLed after ready, a process eating memory
past the floor, a rank's child that escapes its process group (with and without the markers).

Deployment names carry the test's own prefix; every test leaves nothing of them running."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sparkfleet.state.deployments import Deployments
from tests.fleet.loopback import LoopbackFleet
from tests.integration.conftest import leftover_processes, sparkfleet, standin_recipe
from tests.integration.test_lifecycle_fleet import free_port

pytestmark = pytest.mark.integration

INTERVAL = 2.0
# Two poll intervals, plus what one poll may take on a loaded 2-core machine (ssh round trips).
TWO_POLLS_S = 2 * INTERVAL + 3.0


def _engine_pid(name: str, rank: int) -> int:
    """The stand-in engine process of a rank (the monitor carries no markers)."""
    for pid in leftover_processes(name):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"SPARKFLEET_RANK={rank}".encode() in environ and b"standin_engine" in cmdline:
            return pid
    raise AssertionError(f"no engine process of {name} rank {rank}")


@contextmanager
def watching(name: str, out: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`sparkfleet watch NAME` in the background, its output in a file (read while it runs)."""
    with out.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "sparkfleet.cli.main", "watch", name, "--interval",
                                 str(INTERVAL), *args], stdout=fh, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "COLUMNS": "300"})  # fmt: skip
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)


def _wait_event(name: str, kind: str, deadline_s: float, after: int = 0) -> dict:
    """The first event of kind (past the first `after` ones) in name's timeline."""
    deadline = time.monotonic() + deadline_s
    while True:
        found = [e for e in Deployments().events(name, limit=500) if e["kind"] == kind]
        if len(found) > after:
            return found[after]
        if time.monotonic() > deadline:
            kinds = [(e["kind"], e["message"][:80]) for e in Deployments().events(name, limit=30)]
            raise AssertionError(f"no {kind} event after {deadline_s:.0f}s; timeline: {kinds}")
        time.sleep(0.2)


def _status(name: str) -> dict:
    out = sparkfleet("status", name, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)[0]


def _wait_polled(out: Path, polls: int = 1, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while len(re.findall(r"^\d\d:\d\d:\d\d ", out.read_text(), re.M)) < polls:
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.2)


def test_rank_killed_after_ready_is_an_event_and_status_says_exited(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    name = "test-watch-kill"
    recipe = standin_recipe(tmp_path / name, nodes=2, port=free_port())
    assert sparkfleet("up", str(recipe), "--cluster", str(fleet2.cluster_file)).returncode == 0
    out = tmp_path / "watch.out"
    try:
        with watching(name, out) as proc:
            _wait_polled(out)
            victim = _engine_pid(name, 1)
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            event = _wait_event(name, "rank-exited", TWO_POLLS_S)
            status = _status(name)
            seen = time.time() - killed
            assert proc.poll() is None  # restart = "no": it keeps watching
        print(f"kill -> rank-exited event and status: {seen:.1f}s (interval {INTERVAL}s)")
        assert "rank 1 on node1 exited: exit code -9" in event["message"]
        assert "last log lines:" in event["message"] and "standin worker ready" in event["message"]
        assert event["node"] == "node1"
        rank1 = status["ranks"][1]
        assert rank1["state"] == "exited" and "exit code -9 at " in rank1["detail"], rank1
        assert "after ready" in rank1["detail"] and abs(rank1["exited_at"] - killed) < 5
        assert status["status"] == "degraded" and status["ranks"][0]["state"] == "running"
        assert "rank-exited rank 1 on node1 exited: exit code -9" in out.read_text()
    finally:
        assert sparkfleet("down", name).returncode == 0
    assert leftover_processes(name) == []


def test_on_failure_brings_the_deployment_back_then_gives_up(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    name = "test-watch-restart"
    token = "hf_watchrestart0123456789"
    recipe = standin_recipe(tmp_path / name, nodes=2, port=free_port(), env={"HF_TOKEN": token})
    with (recipe / "recipe.toml").open("a") as fh:
        fh.write('[serve]\nrestart = "on-failure"\nmax_restarts = 1\nbackoff = 1\n')
    assert sparkfleet("up", str(recipe), "--cluster", str(fleet2.cluster_file)).returncode == 0
    first = Deployments().get(name)
    assert first is not None and first.instance
    out = tmp_path / "watch.out"
    try:
        with watching(name, out) as proc:
            _wait_polled(out)
            os.kill(_engine_pid(name, 0), signal.SIGKILL)
            _wait_event(name, "restarted", 90)
            status = _status(name)
            assert status["status"] == "ready" and status["restarts"] == 1
            assert [r["state"] for r in status["ranks"]] == ["running", "running"]
            assert status["ranks"][0]["health"] == "healthy"
            again = Deployments().get(name)
            assert again is not None and again.instance != first.instance
            # The token came back from the rank's env file on its node; the store never held it.
            environ = Path(f"/proc/{_engine_pid(name, 0)}/environ").read_bytes().split(b"\0")
            assert f"HF_TOKEN={token}".encode() in environ
            for db in Path(os.environ["SPARKFLEET_STATE_DIR"]).glob("state.db*"):
                assert token.encode() not in db.read_bytes(), db
            kinds = [e["kind"] for e in Deployments().events(name, limit=100)]
            steps = kinds[kinds.index("rank-exited") :]
            # Each step of the restart is on the timeline, up's own events of the new instance between.
            assert [
                k
                for k in steps
                if k in ("rank-exited", "health-lost", "restart", "restart-down", "up", "ready", "restarted")
            ] == ["rank-exited", "health-lost", "restart", "restart-down", "up", "ready", "restarted"], steps

            # The second death is one more than max_restarts = 1 allows: it gives up, saying so.
            _wait_polled(out, polls=len(re.findall(r"^\d\d:\d\d:\d\d ", out.read_text(), re.M)) + 1)
            os.kill(_engine_pid(name, 1), signal.SIGKILL)
            gave_up = _wait_event(name, "gave-up", 60)
            assert proc.wait(timeout=60) == 1
        assert "1 restart(s) made, max_restarts = 1" in gave_up["message"]
        assert "gave-up gave up on test-watch-restart" in out.read_text()
        assert _status(name)["status"] == "failed"
        assert leftover_processes(name) == []
    finally:
        sparkfleet("down", name)
    assert leftover_processes(name) == []


EATER = (
    "import os, sys, time; b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * len(b[::4096]); "
    "print(os.getpid(), flush=True); time.sleep(120)"
)


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable")


def test_a_process_eating_memory_past_the_floor_is_an_event(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    name = "test-watch-mem"
    # Loopback nodes share this machine's memory: the floor sits 2 GiB under what is free now,
    # and the eater takes 4 GiB, so others' jitter neither fires it early nor hides it.
    floor = _mem_available() - (2 << 30)
    recipe = standin_recipe(tmp_path / name, nodes=2, port=free_port())
    with (recipe / "recipe.toml").open("a") as fh:
        fh.write(f"[serve]\nmem_floor = {floor}\n")
    assert sparkfleet("up", str(recipe), "--cluster", str(fleet2.cluster_file)).returncode == 0
    out = tmp_path / "watch.out"
    eater = None
    try:
        with watching(name, out):
            _wait_polled(out)
            assert [e for e in Deployments().events(name) if e["kind"] == "mem-low"] == []
            # A process on node1, started over its sshd like anything a user runs there.
            ssh = subprocess.Popen(fleet2.ssh_argv(1, ["python3", "-c", f'"{EATER}"', "4096"]), stdout=subprocess.PIPE,
                                   text=True)  # fmt: skip
            assert ssh.stdout is not None
            eater = int(ssh.stdout.readline())  # once it holds the memory
            low = _wait_event(name, "mem-low", 60)
            assert "is under the floor" in low["message"] and "[serve] mem_floor" in low["message"]
            os.kill(eater, signal.SIGKILL)
            eater = None
            ssh.wait(timeout=30)
            ok = _wait_event(name, "mem-ok", 60)
            assert "low-water" in ok["message"]
        samples = [s for s in _series(name) if s["mem_available"] is not None]
        assert {s["node"] for s in samples} == {"node0", "node1"}
        assert min(s["mem_available"] for s in samples) < floor
    finally:
        if eater is not None:
            os.kill(eater, signal.SIGKILL)
        assert sparkfleet("down", name).returncode == 0
    assert leftover_processes(name) == []


def _series(name: str) -> list[dict]:
    from sparkfleet.state.watch_series import WatchSeries

    return WatchSeries().samples(name)


def _orphan_pid(fleet: LoopbackFleet, name: str, rank: int) -> int:
    log = fleet.nodes[rank].state_dir / "deployments" / name / f"r{rank}.log"
    deadline = time.monotonic() + 30
    while not (m := re.search(r"standin: orphan pid (\d+)", log.read_text() if log.exists() else "")):
        assert time.monotonic() < deadline, "the stand-in never reported its orphan"
        time.sleep(0.1)
    return int(m.group(1))


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_down_names_a_child_that_escaped_without_markers(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    name = "test-watch-leftover"
    recipe = standin_recipe(tmp_path / name, nodes=2, port=free_port(),
                            env={"STANDIN_ORPHAN": "drop", "STANDIN_FAULT_RANK": "1"})  # fmt: skip
    assert sparkfleet("up", str(recipe), "--cluster", str(fleet2.cluster_file)).returncode == 0
    orphan = _orphan_pid(fleet2, name, 1)
    try:
        down = sparkfleet("down", name)
        assert down.returncode == 2, down.stdout + down.stderr
        assert f"node1: pid {orphan} (sleep 600)" in down.stderr
        assert "carries no sparkfleet markers, but its working directory is" in down.stderr
        assert _alive(orphan)  # named, not killed: without markers it might be anyone's
        # The memory report per node comes first.
        assert re.search(r"node0: MemAvailable [\d.]+ \w+ before, [\d.]+ \w+ after", down.stdout), down.stdout
        assert "node1: MemAvailable" in down.stdout and "no nvidia-smi" in down.stdout
        assert _status(name)["status"] == "leftover"
    finally:
        os.kill(orphan, signal.SIGKILL)
    clean = sparkfleet("down", name)
    assert clean.returncode == 0, clean.stderr
    assert "nothing of the instance is left" in clean.stdout


_LISTENER = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
time.sleep(600)
"""


def test_down_names_a_process_without_markers_that_listens_on_a_rank_port(
    fleet2: LoopbackFleet, tmp_path: Path
) -> None:
    name = "test-watch-listener"
    port = free_port()
    recipe = standin_recipe(tmp_path / name, nodes=2, port=port)
    assert sparkfleet("up", str(recipe), "--cluster", str(fleet2.cluster_file)).returncode == 0
    # A helper that left the rank with neither its markers nor its working directory, and still
    # holds the ranks' rendezvous port.
    listener = subprocess.Popen([sys.executable, "-c", _LISTENER, str(port + 1)], cwd="/",
                                env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE,
                                start_new_session=True)  # fmt: skip
    try:
        assert listener.stdout is not None and listener.stdout.readline() == b"listening\n"
        down = sparkfleet("down", name)
        assert down.returncode == 2, down.stdout + down.stderr
        assert f"pid {listener.pid} " in down.stderr
        assert f"carries no sparkfleet markers, but it listens on port {port + 1}" in down.stderr
        assert listener.poll() is None  # named, not killed: without markers it might be anyone's
    finally:
        listener.kill()
        listener.wait()
    clean = sparkfleet("down", name)
    assert clean.returncode == 0, clean.stderr
    assert leftover_processes(name) == []


def test_down_stops_a_child_that_escaped_with_markers(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    name = "test-watch-escapee"
    recipe = standin_recipe(tmp_path / name, nodes=2, port=free_port(),
                            env={"STANDIN_ORPHAN": "keep", "STANDIN_FAULT_RANK": "1"})  # fmt: skip
    assert sparkfleet("up", str(recipe), "--cluster", str(fleet2.cluster_file)).returncode == 0
    orphan = _orphan_pid(fleet2, name, 1)
    assert os.getsid(orphan) != os.getsid(_engine_pid(name, 1))  # it did leave the rank's session
    try:
        down = sparkfleet("down", name)
        assert down.returncode == 0, down.stderr
        assert "nothing of the instance is left" in down.stdout
        assert not _alive(orphan)
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)
    assert leftover_processes(name) == []


def test_the_systemd_unit_verifies_and_runs_watch_of_the_deployment(fleet2: LoopbackFleet, tmp_path: Path) -> None:
    name = "test-watch-unit"
    recipe = standin_recipe(tmp_path / name, nodes=2, port=free_port())
    assert sparkfleet("up", str(recipe), "--cluster", str(fleet2.cluster_file)).returncode == 0
    try:
        unit = tmp_path / f"sparkfleet-watch-{name}.service"
        out = sparkfleet("export", "systemd", name, "--out", str(unit), "--interval", "2")
        assert out.returncode == 0, out.stderr
        verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr
        # What systemd would run: ExecStart with the unit's Environment= (its quoting is the shell's
        # for these words; %% is its escaped %).
        text = unit.read_text()
        env = dict(shlex.split(line.removeprefix("Environment="))[0].split("=", 1)
                   for line in text.splitlines() if line.startswith("Environment="))  # fmt: skip
        assert env["SPARKFLEET_STATE_DIR"] == str(Path(os.environ["SPARKFLEET_STATE_DIR"]).resolve())
        exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
        argv = [w.replace("%%", "%") for w in shlex.split(exec_start.removeprefix("ExecStart="))]
        assert Path(argv[0]).is_absolute() and argv[3:5] == ["watch", name]
        run = subprocess.run([*argv, "--count", "2"], capture_output=True, text=True, timeout=120,
                             env={"PATH": "/usr/bin:/bin", **env})  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        assert {s["node"] for s in _series(name)} == {"node0", "node1"}
        assert "KillMode=process" in text and "WantedBy=multi-user.target" in text
    finally:
        assert sparkfleet("down", name).returncode == 0
