"""The unit tests' fake node answers as the real node agent does: one lifecycle scenario (start,
probe, holders, preflight, find, watch, stop, leftovers), run through the library's own node
calls against ``tests/fake_node.FakeNode`` and against the real agent on this machine, with the
same observations required of both. A change to the agent that the fake does not follow fails
here, not in a green unit test of a lifecycle that no longer exists."""

from __future__ import annotations

import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sparkfleet.config.cluster import parse_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.doctor.probes.gpu import APPS_COMMAND
from sparkfleet.nodes.identity import FoundRank, Instance
from sparkfleet.nodes.inspection import leftovers_on, watch_node
from sparkfleet.nodes.runtime import port_holders, preflight
from sparkfleet.nodes.runtime.process import ProcessRuntime
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.nodes.transport.local import LocalTransport
from sparkfleet.nodes.transport.mock import MockTransport
from sparkfleet.plan.build import plan
from sparkfleet.plan.model import Plan
from tests.fake_node import FakeNode
from tests.integration.conftest import leftover_processes, standin_recipe

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _plan(tmp: Path, name: str) -> Plan:
    port = _free_port()
    recipe = standin_recipe(tmp / "recipe", nodes=1, port=port)
    cluster = parse_cluster(
        {
            "name": "contract",
            "defaults": {"gpus": "none", "memlock": "none", "rdma": False, "state_dir": str(tmp / "node"),
                         "python": sys.executable, "bind_address": "127.0.0.1"},
            "nodes": [{"name": "node0", "host": "127.0.0.1"}],
        },
        "contract.toml",
    )  # fmt: skip
    return plan(load_recipe(recipe), cluster, name)


@dataclass
class Seen:
    """What the scenario observed, in terms a lifecycle test would assert on."""

    started: bool
    running: str
    holder_is_ours: bool
    preflight: tuple[list[tuple[int | None, str | None]], bool]
    found: list[tuple[int | None, str | None]]
    watched: str
    stopped_any: bool
    after_stop: str
    leftovers: list[Any]
    mem_reported: bool


def _until(what: Any, ok: Any, seconds: float = 20.0) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = what()
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def _whose(found: FoundRank, instance: Instance) -> tuple[int | None, str | None]:
    return found.rank, "ours" if found.instance == instance.id else found.instance


def scenario(planned: Plan, transport: Transport) -> Seen:
    rank = planned.ranks[0]
    handle, node, runtime = rank.handle, rank.node, ProcessRuntime()
    instance = Instance.new(planned.name)
    since = time.time() - 1
    pid = runtime.start(rank, transport, instance)
    try:
        state, _log = _until(lambda: runtime.probe(handle, transport), lambda s: s[0].state == "running")
        # The stand-in binds its port a moment after it starts; the fake holds it at once.
        holders = _until(lambda: port_holders(transport, node.python, (planned.port,)), bool)
        found_before, held = preflight(transport, node, planned.name, [planned.port], containers=False)
        found = runtime.find(transport, planned.name, node)
        watched = watch_node(transport, node, [handle])
        stopped = runtime.stop(handle, transport, planned.name, instance.id, grace=5)
        after = _until(lambda: watch_node(transport, node, [handle]).ranks[0].state, lambda s: s != "running")
        left = leftovers_on(transport, node, planned.name, instance.id, since, [handle], APPS_COMMAND)
    finally:
        runtime.stop(handle, transport, planned.name, None, grace=1)
    return Seen(
        started=bool(pid),
        running=state.state,
        holder_is_ours=[h.instance for h in holders] == [instance.id],
        preflight=([_whose(f, instance) for f in found_before], bool(held)),
        found=[_whose(f, instance) for f in found],
        watched=watched.ranks[0].state,
        stopped_any=bool(stopped),
        after_stop=after,
        leftovers=list(left.leftovers),
        mem_reported=isinstance(watched.mem_available, int) and isinstance(left.mem_available, int),
    )


EXPECTED = Seen(
    started=True,
    running="running",
    holder_is_ours=True,
    preflight=([(0, "ours")], True),
    found=[(0, "ours")],
    watched="running",
    stopped_any=True,
    after_stop="exited",
    leftovers=[],
    mem_reported=True,
)


def test_the_real_agent_on_this_machine(tmp_path: Path) -> None:
    planned = _plan(tmp_path, "contract-real")
    try:
        assert scenario(planned, LocalTransport("node0")) == EXPECTED
    finally:
        assert leftover_processes("contract-real") == []


def test_the_fake_node_of_the_unit_tests(tmp_path: Path) -> None:
    planned = _plan(tmp_path, "contract-fake")
    fake = FakeNode("node0")
    assert scenario(planned, MockTransport("node0", fake)) == EXPECTED
    assert fake.running() == []
