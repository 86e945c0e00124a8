"""up, rollback, readiness, smoke and down against scripted nodes (MockTransport): every phase of
up interrupted by a real signal, or failing, leaves nothing running; an instance stops only its
own ranks. The same paths run on real sshd/dockerd/engines in tests/integration and tests/e2e."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkfleet.apply.down import down
from sparkfleet.apply.observe import logs, status
from sparkfleet.apply.up import up
from sparkfleet.errors import ReadinessError, RollbackIncomplete, SparkfleetError, StateError, TransportError
from sparkfleet.nodes.transport.mock import Call
from sparkfleet.state.deployments import Deployments
from tests.fake_node import FakeFleet, FakeNode, fake_fleet, head_server

STAGED = """
[[staging]]
kind = "copy"
id = "cfg"
files = ["/etc/hostname"]
dst = "/tmp/sparkfleet-fake-copy"

[[staging]]
kind = "sparse-rows"
id = "rows"
src = "/models/x"
dst = "/tmp/sparkfleet-fake-rows"
tables = ["t.weight"]
"""


def _signal_soon(sig: int) -> None:
    """Deliver a real signal to this process (the main thread runs its handler)."""
    os.kill(os.getpid(), sig)


def _run(fleet: FakeFleet, report: Callable[[str | None, int | None, str], None] | None = None,
         timeout: float = 20) -> None:  # fmt: skip
    up(fleet.plan, report=report or (lambda *_: None), timeout=timeout, connect=fleet.connect)


def test_up_then_down_leaves_nothing(tmp_path: Path) -> None:
    with head_server() as port:
        fleet = fake_fleet(tmp_path, port=port)
        _run(fleet)
        assert sorted(fleet.left_running()) == [("node0", 0), ("node1", 1)]
        record = Deployments().get("fake")
        assert record is not None and record.status == "ready" and record.instance
        # Both ranks carry this up's instance id.
        assert {r.instance for n in fleet.nodes.values() for r in n.ranks} == {record.instance}
        stopped = down(record, connect=fleet.connect)
        assert len(stopped) == 2 and fleet.left_running() == []


# Every phase of up, entered or in flight, with Ctrl-C and with SIGTERM.
PHASE_MESSAGES = {
    "connect": "connecting",
    "preflight": "checking names and ports",
    "start": "started",
    "readiness": "waiting for",
    "smoke": "healthy; smoke test",
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("phase", list(PHASE_MESSAGES))
def test_signal_in_each_phase_rolls_back(tmp_path: Path, phase: str, sig: int) -> None:
    fired = threading.Event()

    def report(_node: str | None, _rank: int | None, message: str) -> None:
        if message.startswith(PHASE_MESSAGES[phase]) and not fired.is_set():
            fired.set()
            _signal_soon(sig)
            time.sleep(0.3)  # the handler runs here, in the phase

    with head_server() as port:
        fleet = fake_fleet(tmp_path, port=port)
        if phase == "readiness":
            for node in fleet.nodes.values():
                node.boot_log = "loading\n"  # still loading: up waits for the expected line
            (tmp_path / "recipe.toml").write_text((tmp_path / "recipe.toml").read_text()
                                                  + '[verify]\nexpect = ["fired up"]\n')  # fmt: skip
            fleet = FakeFleet(fleet.nodes, fleet.cluster, _replan(tmp_path, fleet))
        with pytest.raises(KeyboardInterrupt, match="every started rank was stopped"):
            _run(fleet, report)
    assert fired.is_set()
    assert fleet.left_running() == []
    record = Deployments().get("fake")
    assert record is not None and record.status == "failed"


def _replan(tmp: Path, fleet: FakeFleet):  # type: ignore[no-untyped-def]
    from sparkfleet.config.recipe import load_recipe
    from sparkfleet.plan.build import plan

    return plan(load_recipe(tmp / "recipe.toml"), fleet.cluster, "fake")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("phase", ["images", "distribution", "staging"])
def test_signal_in_image_and_staging_phases_rolls_back(tmp_path: Path, phase: str, sig: int) -> None:
    messages = {"images": "checking images", "distribution": "distributing", "staging": "staging"}
    fired = threading.Event()

    def report(_node: str | None, _rank: int | None, message: str) -> None:
        if message.startswith(messages[phase]) and not fired.is_set():
            fired.set()
            _signal_soon(sig)
            time.sleep(0.3)

    # Distribution runs before node staging: the staging phase's recipe has only a sparse-rows step.
    extra = STAGED if phase != "staging" else STAGED[STAGED.index('[[staging]]\nkind = "sparse-rows"') :]
    fleet = fake_fleet(tmp_path, port=18999, image="fake:1", extra=extra)
    assert "sparse-rows" in {s.kind for s in fleet.plan.staging}
    with pytest.raises(KeyboardInterrupt, match="every started rank was stopped"):
        _run(fleet, report)
    assert fired.is_set() and fleet.left_running() == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_signal_while_a_rank_start_is_in_flight_still_stops_that_rank(tmp_path: Path, sig: int) -> None:
    """The worker's start command is still running when the signal lands; it completes, and the
    rollback (which waits for it) stops the rank it started."""
    with head_server() as port:
        fleet = fake_fleet(tmp_path, nodes=3, port=port)

        def slow_start(call: Call) -> None:
            if call.node == "node2" and "start" in call.argv[3:5]:
                _signal_soon(sig)
                time.sleep(0.2)

        fleet.nodes["node2"].on_call = slow_start
        with pytest.raises(KeyboardInterrupt, match="every started rank was stopped"):
            _run(fleet, lambda *a: print("REPORT", a))
        assert [r.rank for r in fleet.nodes["node2"].ranks] == [2]  # it did start...
        assert fleet.left_running() == []  # ...and was stopped


def test_signal_during_the_smoke_request_rolls_back(tmp_path: Path) -> None:
    with head_server(on_completion=lambda: (_signal_soon(signal.SIGINT), time.sleep(0.3))) as port:  # type: ignore[func-returns-value]
        fleet = fake_fleet(tmp_path, port=port)
        with pytest.raises(KeyboardInterrupt, match="every started rank was stopped"):
            _run(fleet)
    assert fleet.left_running() == []


def test_failures_in_each_phase_roll_back(tmp_path: Path) -> None:
    with head_server(answer=" 41") as port:
        (tmp_path / "smoke").mkdir()
        fleet = fake_fleet(tmp_path / "smoke", port=port)
        with pytest.raises(ReadinessError, match="smoke test failed"):
            _run(fleet)
        assert fleet.left_running() == []
    with head_server() as port:
        (tmp_path / "start").mkdir()
        fleet = fake_fleet(tmp_path / "start", port=port, name="fake2")
        fleet.nodes["node0"].fail_start = True  # the head cannot start: the worker already runs
        with pytest.raises(SparkfleetError):
            _run(fleet)
        assert fleet.left_running() == []


def test_a_rollback_that_cannot_reach_a_node_names_it_and_what_failed(tmp_path: Path) -> None:
    with head_server(answer=" 41") as port:
        fleet = fake_fleet(tmp_path, port=port)

        def gone_at_stop(call: Call) -> None:
            if "stop" in call.argv[3:5]:
                raise TransportError("node1", "cannot reach 127.0.0.1 over SSH: Connection refused")

        fleet.nodes["node1"].on_call = gone_at_stop
        with pytest.raises(RollbackIncomplete, match="smoke test failed") as raised:
            _run(fleet)
    assert list(raised.value.failed) == ["node1"] and "Connection refused" in raised.value.failed["node1"]
    assert [r.rank for r in fleet.nodes["node1"].running()] == [1]  # still running: the error says where


def test_a_name_running_under_another_instance_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with head_server() as port:
        fleet = fake_fleet(tmp_path, port=port)
        fleet.nodes["node1"].foreign = [
            {
                "pid": 4242,
                "rank": 1,
                "instance": "0123456789ab",
                "owner": "alice@lab:/home/alice/.local/state/sparkfleet",
                "started": 1.7e9,
            }
        ]
        with pytest.raises(StateError) as err:
            _run(fleet)
    message = str(err.value)
    assert "alice@lab:/home/alice/.local/state/sparkfleet" in message and "node1: pid 4242" in message
    assert all(not n.ranks for n in fleet.nodes.values())  # refused before any start
    assert fleet.left_running() == []


def test_a_taken_port_is_refused_naming_the_port_and_its_holder(tmp_path: Path) -> None:
    with head_server() as port:
        fleet = fake_fleet(tmp_path, port=port)
        fleet.nodes["node0"].foreign_ports[port] = {
            "port": port,
            "uid": 0,
            "pid": 777,
            "command": "nginx -g daemon",
            "deployment": None,
            "instance": None,
            "owner": None,
        }
        with pytest.raises(StateError) as err:
            _run(fleet)
    assert f"node0: port {port} (rank 0 HTTP) is held by pid 777 (nginx -g daemon)" in str(err.value)
    assert fleet.left_running() == []


def test_health_answered_by_another_server_is_not_ready(tmp_path: Path) -> None:
    """Rank 0 started, but the port's listener is another deployment's process."""
    with head_server() as port:
        fleet = fake_fleet(tmp_path, port=port)
        node0 = fleet.nodes["node0"]
        original = node0._holders

        def other_holds(ports: list[int]) -> list[dict[str, object]]:
            if port in ports and node0.ranks:  # only after our rank started (preflight saw it free)
                return [
                    {
                        "port": port,
                        "uid": 0,
                        "pid": 99,
                        "command": "llama",
                        "deployment": "gemma",
                        "instance": "feedfacecafe",
                        "owner": "bob@lab:/s",
                    }
                ]
            return original(ports)

        node0._holders = other_holds  # type: ignore[method-assign]
        with pytest.raises(
            ReadinessError,
            match=r"port \d+ on node0 answers, but it is held by sparkfleet "
            r"deployment 'gemma' \(instance feedfacecafe",
        ):
            _run(fleet)
    assert fleet.left_running() == []


def test_down_stops_only_its_own_instance(tmp_path: Path) -> None:
    with head_server() as port:
        fleet = fake_fleet(tmp_path, port=port)
        _run(fleet)
        record = Deployments().get("fake")
        assert record is not None
        # Another controller's rank of the same name on node1 (e.g. before this one's preflight).
        from tests.fake_node import Rank

        fleet.nodes["node1"].ranks.append(Rank(1, "0ther0ther00", 5555, "process"))
        down(record, connect=fleet.connect)
    assert fleet.left_running() == [("node1", 1)]


def test_status_and_logs_read_every_rank_through_its_transport(tmp_path: Path) -> None:
    with head_server() as port:
        fleet = fake_fleet(tmp_path, port=port, extra='[env]\nMY_API_KEY = "sekrit-value-99"\n')
        for node in fleet.nodes.values():
            node.boot_log = "loading with key sekrit-value-99\nThe server is fired up and ready to roll!\n"
        _run(fleet)
        record = Deployments().get("fake")
        assert record is not None
        ranks = status(record, connect=fleet.connect)
        assert [(r.rank, r.node, r.state, r.health) for r in ranks] == [
            (0, "node0", "running", "healthy"),
            (1, "node1", "running", "alive"),
        ]
        shown = logs(record, connect=fleet.connect)
        assert "fired up" in shown[0] and "loading with key ***" in shown[1]
        assert "sekrit-value-99" not in "".join(shown.values())  # hidden with the rank's own env file
        # A rank that died after ready, and a node that cannot be reached, as status shows them.
        fleet.nodes["node1"].ranks[-1].running = False
        fleet.nodes["node1"].ranks[-1].exit_code = 3

        def unreachable(call: Call) -> None:
            raise TransportError("node0", "cannot reach 127.0.0.1 over SSH: Connection refused")

        fleet.nodes["node0"].on_call = unreachable
        ranks = status(record, connect=fleet.connect)
    assert ranks[1].state == "exited" and ranks[1].detail.startswith("exit code 3 at ")
    assert ranks[0].state == "unknown" and "cannot reach" in ranks[0].detail


def _stop_calls(fleet: FakeFleet) -> list[tuple[str, str, float]]:
    """Record every node's agent stop as (node, 'begin'|'end', time); the head's stop is slow, as
    SGLang's rank 0 is while it broadcasts shutdown to its workers."""
    seen: list[tuple[str, str, float]] = []
    for node in fleet.nodes.values():
        original = node._agent

        def agent(command: str, payload: dict[str, object], stdin: bytes, node: FakeNode = node,
                  original: Callable[..., object] = original) -> object:  # fmt: skip
            if command != "stop":
                return original(command, payload, stdin)
            seen.append((node.name, "begin", time.monotonic()))
            if node.name == "node0":
                time.sleep(0.3)
            out = original(command, payload, stdin)
            seen.append((node.name, "end", time.monotonic()))
            return out

        node._agent = agent  # type: ignore[method-assign]
    return seen


def test_down_stops_an_sglang_head_before_its_workers(tmp_path: Path) -> None:
    """SGLang workers ignore SIGTERM until rank 0 broadcasts shutdown: the adapter's stop order
    is the head first, then every worker at once."""
    with head_server() as port:
        fleet = fake_fleet(tmp_path, nodes=3, port=port)
        assert [r.stop_wave for r in fleet.plan.ranks] == [0, 1, 1]
        _run(fleet)
        record = Deployments().get("fake")
        assert record is not None and [r.stop_wave for r in record.ranks] == [0, 1, 1]
        seen = _stop_calls(fleet)
        down(record, connect=fleet.connect)
    head_end = next(t for n, what, t in seen if n == "node0" and what == "end")
    workers_begin = [t for n, what, t in seen if n != "node0" and what == "begin"]
    assert len(workers_begin) == 2 and min(workers_begin) >= head_end
    assert fleet.left_running() == []


def test_rollback_follows_the_same_stop_order(tmp_path: Path) -> None:
    with head_server(answer=" 41") as port:  # the smoke test fails: every rank is rolled back
        fleet = fake_fleet(tmp_path, nodes=3, port=port)
        seen = _stop_calls(fleet)
        with pytest.raises(ReadinessError, match="smoke test failed"):
            _run(fleet)
    head_end = next(t for n, what, t in seen if n == "node0" and what == "end")
    assert min(t for n, what, t in seen if n != "node0" and what == "begin") >= head_end
    assert fleet.left_running() == []
