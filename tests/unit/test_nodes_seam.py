"""The nodes seam: transports declare what they can do, stream through a handle, and name a
timeout as such; the fan-out keeps every node's outcome; rank handles survive the state store."""

from __future__ import annotations

import ast
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sparkfleet.config.cluster import parse_cluster
from sparkfleet.errors import NodeError, SparkfleetError, StagingError, TransportError, TransportTimeout
from sparkfleet.nodes import ship
from sparkfleet.nodes.fanout import GroupResult, Outcome, fan_out
from sparkfleet.nodes.runtime import runtime_for
from sparkfleet.nodes.runtime.docker import DockerRuntime
from sparkfleet.nodes.runtime.process import ProcessRuntime
from sparkfleet.nodes.ship import (
    COMPOSE_WORKER,
    NODE_AGENT,
    SNAPSHOT_SCAN,
    STAGE_WORKER,
    ShippedProgram,
    program_text,
    run_shipped,
    shipped_argv,
)
from sparkfleet.nodes.transport import controller, transport_for
from sparkfleet.nodes.transport.base import Capabilities, Result
from sparkfleet.nodes.transport.local import LocalTransport
from sparkfleet.nodes.transport.mock import Call, MockTransport
from sparkfleet.nodes.transport.ssh import SshTransport
from sparkfleet.plan.model import RankHandle
from sparkfleet.state.deployments import Deployments, rank_from_json, rank_to_json
from sparkfleet.state.store import Store


def _ssh_node():  # type: ignore[no-untyped-def]
    cluster = parse_cluster({"name": "c", "defaults": {"user": "ops", "ssh_port": 2222},
                             "nodes": [{"name": "n1", "host": "10.0.0.7"}]}, "c.toml")  # fmt: skip
    return cluster.nodes[0]


# ---- capabilities


def test_local_transport_is_this_machine_and_has_no_ssh() -> None:
    caps = LocalTransport("here").capabilities
    assert caps.local and caps.ssh is None
    assert controller().capabilities.local and controller().node == "controller"


def test_ssh_transport_declares_its_ssh_words_without_connecting() -> None:
    transport = transport_for(_ssh_node())
    caps = transport.capabilities
    assert not caps.local
    assert isinstance(transport, SshTransport) and caps.ssh == tuple(transport.ssh_argv())
    assert caps.ssh is not None and caps.ssh[-1] == "10.0.0.7" and caps.ssh[0] == "ssh"
    assert "-p" in caps.ssh and "2222" in caps.ssh and "ops" in caps.ssh


def test_mock_transport_declares_capabilities_too() -> None:
    assert MockTransport("m", lambda _c: 0).capabilities == Capabilities()
    claimed = Capabilities(local=True)
    assert MockTransport("m", lambda _c: 0, claimed).capabilities is claimed


# ---- timeouts


def test_a_local_timeout_is_a_transport_timeout() -> None:
    with pytest.raises(TransportTimeout) as err:
        LocalTransport("n0").run(["sleep", "5"], timeout=0.2)
    assert isinstance(err.value, TransportError) and err.value.node == "n0"
    assert err.value.timeout == 0.2 and err.value.where == "n0" and err.value.command == "sleep"


def test_a_missing_command_is_not_a_timeout() -> None:
    with pytest.raises(TransportError) as err:
        LocalTransport("n0").run(["sparkfleet-no-such-command"], timeout=5)
    assert not isinstance(err.value, TransportTimeout) and "command not found" in str(err.value)


# ---- streams


def test_a_stream_yields_lines_and_its_exit_code() -> None:
    with LocalTransport("n0").stream(["sh", "-c", "echo one; echo two >&2; exit 3"]) as stream:
        lines = list(stream)
        assert stream.wait(5) == 3 and stream.exit_code == 3
    assert sorted(lines) == ["one", "two"]  # stderr merged by default


def test_a_stream_with_stdin_and_separate_stderr() -> None:
    stream = LocalTransport("n0").stream(["sh", "-c", "cat; echo oops >&2"], stdin=True, merge_stderr=False)
    stream.write(b"x" * 30_000)  # under a pipe buffer: cat can write it all before we read
    stream.close_stdin()
    got = b""
    while chunk := stream.read():
        got += chunk
    assert got == b"x" * 30_000 and stream.wait(10) == 0 and stream.errors() == "oops\n"
    stream.close()


def test_closing_a_stream_stops_the_command() -> None:
    stream = LocalTransport("n0").stream([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"])
    assert next(iter(stream)) == "up" and stream.exit_code is None
    stream.close()
    assert stream.exit_code is not None


def test_a_stream_wait_past_its_timeout_is_a_transport_timeout() -> None:
    with LocalTransport("n0").stream(["sleep", "5"]) as stream, pytest.raises(TransportTimeout):
        stream.wait(0.1)


def test_a_missing_command_cannot_stream() -> None:
    with pytest.raises(TransportError, match="command not found"):
        LocalTransport("n0").stream(["sparkfleet-no-such-command"])


def test_a_mock_stream_is_answered_by_the_handler() -> None:
    def node(call: Call) -> Result:
        return Result("m", call.argv, 1, "a\nb\n", "bad\n", 0.0)

    transport = MockTransport("m", node)
    stream = transport.stream(["tail", "-F", "log"])
    assert list(stream) == ["a", "b", "bad"] and stream.wait() == 1 and stream.exit_code == 1
    piped = transport.stream(["docker", "load"], stdin=True, merge_stderr=False)
    piped.write(b"image")
    assert piped.read() == b"a\nb\n" and piped.errors() == "bad\n" and piped.written == b"image"  # type: ignore[attr-defined]
    assert [c.argv for c in transport.calls] == [("tail", "-F", "log"), ("docker", "load")]


# ---- the fan-out's group result


def _work(name: str) -> int:
    if name == "n1":
        raise StagingError("n1", "disk full")
    if name == "n3":
        raise OSError("connection reset")
    return int(name[1:])


def test_fan_out_keeps_every_outcome_in_node_order() -> None:
    group = fan_out(["n3", "n0", "n1", "n2"], _work)
    assert isinstance(group, GroupResult) and list(group) == ["n3", "n0", "n1", "n2"] and len(group) == 4
    assert group["n0"] == Outcome("n0", 0, None)
    assert group.succeeded == {"n0": 0, "n2": 2}
    assert list(group.failures) == ["n3", "n1"] and isinstance(group.failures["n1"], StagingError)
    assert fan_out([], _work).failures == {} and fan_out(["n0", "n2"], _work).raise_all() == {"n0": 0, "n2": 2}


def test_raise_first_gives_the_first_error_as_it_is() -> None:
    group = fan_out(["n0", "n1", "n3"], _work)
    with pytest.raises(StagingError) as err:
        group.raise_first()
    assert err.value is group.failures["n1"]
    with pytest.raises(SparkfleetError, match=r"^n3: connection reset$") as wrapped:
        fan_out(["n3"], _work).raise_first()
    assert isinstance(wrapped.value.__cause__, OSError)
    assert fan_out(["n0"], _work).raise_first() == {"n0": 0}


def test_raise_all_names_every_failed_node_and_keeps_every_error() -> None:
    group = fan_out(["n0", "n1", "n2", "n3"], _work)
    with pytest.raises(StagingError) as err:
        group.raise_all(StagingError)
    assert err.value.node == "n1" and str(err.value) == "n1: disk full\nn3: connection reset"
    cause = err.value.__cause__
    assert isinstance(cause, ExceptionGroup) and list(cause.exceptions) == list(group.failures.values())
    with pytest.raises(NodeError) as one:
        fan_out(["n1"], _work).raise_all()
    assert str(one.value) == "n1: disk full" and isinstance(one.value.__cause__, StagingError)


def test_raise_all_lets_a_bug_through_with_its_traceback() -> None:
    def buggy(name: str) -> int:
        if name == "b":
            raise KeyError("oops")
        raise StagingError(name, "fine")

    with pytest.raises(KeyError):
        fan_out(["a", "b"], buggy).raise_all(StagingError)


def test_ctrl_c_lets_the_calls_in_flight_finish_and_starts_no_other() -> None:
    # What a rollback relies on: a rank whose start was in flight exists before it looks.
    started: list[str] = []
    finished: list[str] = []

    def work(name: str) -> str:
        started.append(name)
        if name == "n0":
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)  # Ctrl-C meanwhile
            time.sleep(0.3)
        finished.append(name)
        return name

    with pytest.raises(KeyboardInterrupt):
        fan_out(["n0", "n1", "n2"], work, workers=1)
    assert started == finished == ["n0"]


# ---- one way to ship code to a node


# Every program ship.py defines, so that one added later is held to this too.
PROGRAMS = [p for p in vars(ship).values() if isinstance(p, ShippedProgram)]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_every_shipped_program_is_one_stdlib_script(program) -> None:  # type: ignore[no-untyped-def]
    text = program_text(program)
    tree = ast.parse(text)
    imported = {(a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0]
                for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}  # fmt: skip
    assert imported <= sys.stdlib_module_names | {"__future__"}, imported
    assert text.startswith("from __future__ import annotations\n") and text.count("from __future__") == 1
    assert text.count('if __name__ == "__main__":') == 1


def test_shipped_argv_is_python_c_program_then_args() -> None:
    argv = shipped_argv("/opt/py", NODE_AGENT, ["find", "{}"])
    assert argv[:3] == ["/opt/py", "-S", "-c"] and argv[3] == program_text(NODE_AGENT) and argv[4:] == ["find", "{}"]
    # The staging worker keeps site-packages: numpy and xxhash are optional speed-ups there.
    assert shipped_argv("python3", STAGE_WORKER, ["{}"])[:2] == ["python3", "-c"]


def test_run_shipped_runs_the_program_with_args_and_stdin_free_for_data(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    args = json.dumps({"root": str(tmp_path), "revision": None, "hashed": ["*.json"], "hash_limit": 1 << 20})
    result = run_shipped(LocalTransport("n0"), sys.executable, SNAPSHOT_SCAN, [args], timeout=60)
    listing = json.loads(result.stdout)
    assert result.ok and listing["layout"] == "dir" and [f[0] for f in listing["files"]] == ["config.json"]
    seen: list[Call] = []

    def node(call: Call) -> str:
        seen.append(call)
        return "ok"

    run_shipped(MockTransport("m", node), "python3", COMPOSE_WORKER, ["{}"], stdin=b"data")
    assert seen[0].argv[1:3] == ("-S", "-c") and seen[0].argv[4:] == ("{}",) and seen[0].stdin == b"data"


def test_a_shipped_program_writes_nothing_to_the_nodes_home(tmp_path: Path) -> None:
    # Mitogen's rule: the node's disk may be read-only or shared; only ranks' own files go there.
    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    args = json.dumps({"root": str(tmp_path / "absent"), "revision": None, "hashed": [], "hash_limit": 1})
    for program, words in ((SNAPSHOT_SCAN, [args]), (NODE_AGENT, ["watch", '{"ranks": []}'])):
        subprocess.run(shipped_argv(sys.executable, program, words), capture_output=True, env=env, check=True)
    assert list(tmp_path.iterdir()) == []


# ---- rank handles: what the state stores, what the runtimes take after start


def test_a_plans_rank_handles_survive_the_state_store(tmp_path: Path) -> None:
    from sparkfleet.nodes.identity import Instance
    from tests.fake_node import fake_fleet

    fleet = fake_fleet(tmp_path, port=18777, image="fake:1")
    handles = tuple(r.handle for r in fleet.plan.ranks)
    assert all(isinstance(h, RankHandle) and not hasattr(h, "env") for h in handles)
    assert [rank_from_json(json.loads(json.dumps(rank_to_json(h)))) for h in handles] == list(handles)
    records = Deployments(Store(tmp_path / "state.db"))
    records.acquire(fleet.plan, fleet.cluster.source, Instance.new(fleet.plan.name))
    record = records.get(fleet.plan.name)
    assert record is not None and record.ranks == handles
    assert isinstance(runtime_for(record.ranks[0]), DockerRuntime)


# A row as the first sparkfleet with a state store wrote it: no instance or owner columns, and
# ranks_json with exactly the keys of that version.
OLD_RANK = {
    "rank": 0,
    "node": {"name": "local", "host": "127.0.0.1", "fabric_ip": "127.0.0.1", "transport": "local"},
    "runtime": "process", "image": None, "argv": ["llama-server", "--port", "8080"], "mounts": [],
    "container_name": "sparkfleet-gemma-r0", "workdir": "/tmp/w", "env_file": "/tmp/w/r0.env",
    "log_path": "/tmp/w/r0.log", "pid_path": "/tmp/w/r0.pid",
    "readiness": {"serves_http": True, "health_path": "/health", "ready_log": None}, "ports": [8080],
}  # fmt: skip
OLD_SCHEMA = """CREATE TABLE deployments (name TEXT PRIMARY KEY, engine TEXT NOT NULL, recipe TEXT NOT NULL,
    cluster TEXT NOT NULL, endpoint TEXT NOT NULL, served_model TEXT NOT NULL, status TEXT NOT NULL,
    owner_pid INTEGER, owner_host TEXT, created REAL NOT NULL, updated REAL NOT NULL, ready_at REAL,
    ranks_json TEXT NOT NULL)"""


def test_an_old_format_row_loads_as_handles_the_runtimes_take(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with sqlite3.connect(db) as conn:
        conn.execute(OLD_SCHEMA)
        conn.execute("INSERT INTO deployments VALUES ('gemma', 'llama-cpp', 'r.toml', '(local)', "
                     "'http://127.0.0.1:8080', 'gemma', 'ready', 1, 'h', 1.0, 2.0, 2.0, ?)",
                     (json.dumps([OLD_RANK]),))  # fmt: skip
    record = Deployments(Store(db)).get("gemma")
    assert record is not None and record.instance is None and record.owner is None
    (handle,) = record.ranks
    assert isinstance(handle, RankHandle) and handle.node.name == "local" and handle.ports == (8080,)
    assert handle.node.python == "python3" and handle.node.transport == "local"  # the fields it lacked
    assert handle.exit_path == "/tmp/w/r0.exit" and handle.readiness.tcp_port is None
    # Keys it lacked come back at their defaults; stop_wave 0: every rank at once, as then.
    assert rank_to_json(handle) == {**OLD_RANK, "node": rank_to_json(handle)["node"],
                                    "readiness": {**OLD_RANK["readiness"], "tcp_port": None},
                                    "stop_wave": 0}  # fmt: skip
    seen: list[Call] = []

    def node(call: Call) -> str:
        seen.append(call)
        state = {"state": "exited", "pid": None, "exit_code": 0, "started_at": None, "exited_at": 2.5}
        return json.dumps({"ranks": [state], "mem_available": 1, "cpu_s": 0.0})

    state = ProcessRuntime().inspect(handle, MockTransport("local", node))
    assert state.state == "exited" and state.exit_code == 0 and state.exited_at == 2.5
    (asked,) = json.loads(seen[0].argv[5])["ranks"]
    assert (seen[0].argv[4], asked["pid_path"], asked["exit_path"]) == ("watch", "/tmp/w/r0.pid", "/tmp/w/r0.exit")


def test_a_row_missing_later_keys_still_loads() -> None:
    sparse = {k: v for k, v in OLD_RANK.items() if k not in ("mounts", "ports", "runtime", "workdir")}
    sparse["readiness"] = {"serves_http": True, "health_path": "/health", "ready_log": None, "future": 1}
    handle = rank_from_json(sparse)
    assert handle.runtime == "process" and handle.mounts == () and handle.ports == () and handle.workdir == ""


def test_runtimes_follow_a_handles_log_through_a_stream() -> None:
    handle = rank_from_json(OLD_RANK)
    transport = MockTransport("local", lambda call: "line one\nline two\n")
    assert list(ProcessRuntime().follow(handle, transport)) == ["line one", "line two"]
    assert transport.calls[-1].argv == ("tail", "-n", "50", "-F", "/tmp/w/r0.log")
    DockerRuntime().follow(handle, transport)
    assert transport.calls[-1].argv[-2:] == ("-f", "sparkfleet-gemma-r0")


def test_sync_reads_capabilities_not_classes() -> None:
    """rsync from a source node runs there (through its transport's stream) and reaches the
    target with the ssh words the target's transport declares; a local path needs no ssh."""
    from sparkfleet.apply.staging.transfer import Endpoint, _rsync

    def ssh_caps(host: str) -> Capabilities:
        return Capabilities(ssh=("ssh", "-p", "2222", "-l", "ops", host))

    def node(call: Call) -> str:
        if call.argv[0] == "rsync":
            return "Number of regular files transferred: 1\nLiteral data: 5\n"
        return ""  # which of the controller's ssh files exist on the source node: none

    source = MockTransport("n0", node, ssh_caps("10.0.0.1"))
    target = MockTransport("n1", node, ssh_caps("10.0.0.2"))
    stats = _rsync(Endpoint(source, "/src", "10.9.0.1"), Endpoint(target, "/dst", "10.9.0.2"), ["a"], None)
    assert stats["literal"] == 5 and target.calls == []
    argv = source.calls[-1].argv
    assert argv[0] == "rsync" and argv[-2:] == ("/src/", "10.9.0.2:/dst/")
    ssh = argv[argv.index("-e") + 1]
    assert ssh.startswith("ssh -o BatchMode=yes") and "-p 2222 -l ops" in ssh
    assert Endpoint(LocalTransport("here"), "/x").local and not Endpoint(source, "/x").local


def test_an_image_streams_from_one_node_to_the_others_through_transport_streams() -> None:
    from sparkfleet.nodes.runtime.docker import stream_image

    sinks: dict[str, object] = {}

    def source(call: Call) -> str:
        assert call.argv == ("docker", "save", "img:1")
        return "IMAGE-TAR-BYTES" * 1000

    def target(call: Call) -> Result:
        assert call.argv == ("docker", "load", "-q")
        code = 1 if call.node == "bad" else 0
        return Result(call.node, call.argv, code, "Loaded image: img:1\n", "no space" if code else "", 0.0)

    targets = {n: MockTransport(n, target) for n in ("good", "bad")}
    originals = {n: t.stream for n, t in targets.items()}
    for n, t in targets.items():
        t.stream = lambda argv, _n=n, **kw: sinks.setdefault(_n, originals[_n](argv, **kw))  # type: ignore[method-assign]
    errors = stream_image(MockTransport("src", source), "img:1", targets)
    assert errors == {"bad": "docker load failed: no space"}
    assert bytes(sinks["good"].written) == b"IMAGE-TAR-BYTES" * 1000  # type: ignore[attr-defined]


def test_an_unknown_deployment_is_one_error_with_the_closest_name(tmp_path: Path) -> None:
    from sparkfleet.errors import NotFoundError
    from sparkfleet.nodes.identity import Instance
    from tests.fake_node import fake_fleet

    fleet = fake_fleet(tmp_path, port=18778, image="fake:1")
    records = Deployments(Store(tmp_path / "state.db"))
    records.acquire(fleet.plan, fleet.cluster.source, Instance.new(fleet.plan.name))
    assert records.require(fleet.plan.name).name == fleet.plan.name
    with pytest.raises(NotFoundError) as err:
        records.require(fleet.plan.name + "x")
    assert err.value.message == (f"no deployment named {fleet.plan.name + 'x'!r} (did you mean {fleet.plan.name!r}?); "
                                 "`sparkfleet status` lists them")  # fmt: skip
