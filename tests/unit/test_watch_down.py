"""watch, the restart policy and down's proof against scripted nodes (tests/fake_node.py), and
the stored Plan's round trip; the same paths run on a real loopback fleet in
tests/integration/test_watch_fleet.py. nvidia-smi's answer is the one captured on an H200."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sparkfleet.apply.down import down, take_down
from sparkfleet.apply.up import up
from sparkfleet.apply.watch import Watcher
from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.dashboard.data import restart_deployment
from sparkfleet.errors import LeftoverError, StateError
from sparkfleet.plan.build import plan
from sparkfleet.plan.model import EnvVar, Overrides, RankPlan
from sparkfleet.state.deployments import Deployments
from sparkfleet.state.history import History
from sparkfleet.state.plans import plan_from_json, plan_to_json, with_secrets
from sparkfleet.state.store import Store
from sparkfleet.state.watch_series import Sample, WatchSeries
from tests.conftest import SEEDS, SPARK4
from tests.fake_node import FakeFleet, fake_fleet, head_server

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOKEN = "hf_unitwatchsecret0123"


def _up(fleet: FakeFleet) -> None:
    up(fleet.plan, timeout=20, connect=fleet.connect)


def _kinds(name: str = "fake") -> list[str]:
    return [e["kind"] for e in Deployments().events(name, limit=200)]


def test_a_rank_that_dies_after_ready_is_an_event_and_the_deployment_is_degraded(tmp_path: Path) -> None:
    with head_server() as port:
        fleet = fake_fleet(tmp_path, port=port)
        _up(fleet)
        watcher = Watcher("fake", connect=fleet.connect, interval=1)
        first = watcher.poll()
        assert first.events == [] and first.status == "ready" and first.health == "healthy"
        dead = fleet.nodes["node1"].ranks[-1]
        dead.running, dead.exit_code = False, -9
        second = watcher.poll()
        assert [e.kind for e in second.events] == ["rank-exited"]
        assert second.events[0].message.startswith("rank 1 on node1 exited: exit code -9 at ")
        assert second.status == "degraded"
        assert watcher.poll().events == []  # reported once, not at every poll
        rows = WatchSeries().samples("fake")
        assert {r["node"] for r in rows} == {"node0", "node1"} and len(rows) == 6
        assert [r["health"] for r in rows if r["node"] == "node0"] == ["healthy"] * 3


def test_on_failure_restarts_from_the_stored_plan_with_the_secret_from_the_env_file(tmp_path: Path) -> None:
    with head_server() as port:
        policy = '[serve]\nrestart = "on-failure"\nmax_restarts = 1\nbackoff = 0\n'
        fleet = fake_fleet(tmp_path, port=port, extra=policy)
        fleet = dataclasses.replace(
            fleet,
            plan=dataclasses.replace(
                fleet.plan, ranks=tuple(dataclasses.replace(r, env=(*r.env, *_token(r))) for r in fleet.plan.ranks)
            ),
        )
        _up(fleet)
        watcher = Watcher("fake", connect=fleet.connect, interval=1)
        watcher.poll()
        fleet.nodes["node0"].ranks[-1].running = False
        poll = watcher.poll()
        # The head server stays up (it is not the rank), so health is never lost here.
        assert [e.kind for e in poll.events] == ["rank-exited", "restart", "restart-down", "restarted"]
        record = Deployments().get("fake")
        assert record is not None and record.status == "ready" and record.restarts == 1
        assert "restarted" in _kinds()
        # The restart is a configuration of its own, recorded as the one it replaced.
        first, again = reversed(History(Store()).of("fake"))
        assert again.ready and again.instance == record.instance != first.instance
        assert (again.recipe, again.variant, again.sets) == (first.recipe, first.variant, first.sets)
        # The restarted ranks got the token back from the env file the first up wrote.
        newest = [n.ranks[-1] for n in fleet.nodes.values()]
        assert all(f"HF_TOKEN={TOKEN}" in "".join(r.files.values()) for r in newest)
        assert sorted(fleet.left_running()) == [("node0", 0), ("node1", 1)]
        # A second death: max_restarts = 1 is spent, so it gives up and leaves nothing running.
        fleet.nodes["node1"].ranks[-1].running = False
        watcher.poll()
        assert watcher.outcome is not None and not watcher.outcome.ready
        assert "1 restart(s) made, max_restarts = 1" in watcher.outcome.message
        assert fleet.left_running() == []
        assert Deployments().get("fake").status == "failed"  # type: ignore[union-attr]


def test_the_dashboards_restart_brings_the_stored_plan_back_and_records_it(tmp_path: Path) -> None:
    with head_server() as port:
        fleet = fake_fleet(tmp_path, port=port)
        _up(fleet)
        (tmp_path / "recipe.toml").write_text("not a recipe any more")  # a restart never re-plans the files
        endpoint = restart_deployment(Store(), "fake", connect=fleet.connect)
        assert endpoint == fleet.plan.endpoint
        record = Deployments().get("fake")
        assert record is not None and record.status == "ready"
        assert [c.ready for c in History(Store()).of("fake")] == [True, True]
        assert sorted(fleet.left_running()) == [("node0", 0), ("node1", 1)]  # the first instance's are gone
        down(record, connect=fleet.connect)


def _token(_rank: RankPlan) -> tuple[EnvVar, ...]:
    return (EnvVar("HF_TOKEN", TOKEN, "cli"),)


def test_memory_under_the_floor_is_an_event_once_and_its_recovery_another(tmp_path: Path) -> None:
    with head_server() as port:
        fleet = fake_fleet(tmp_path, port=port, extra='[serve]\nmem_floor = "4 GiB"\n')
        _up(fleet)
        watcher = Watcher("fake", connect=fleet.connect, interval=1)
        assert watcher.poll().events == []
        fleet.nodes["node1"].mem_available = 3 << 30
        low = watcher.poll().events
        assert [(e.kind, e.node) for e in low] == [("mem-low", "node1")]
        assert "MemAvailable 3.0 GiB is under the floor 4.0 GiB" in low[0].message
        assert watcher.poll().events == []
        fleet.nodes["node1"].mem_available = 6 << 30
        ok = watcher.poll().events
        assert [e.kind for e in ok] == ["mem-ok"] and "low-water 3.0 GiB" in ok[0].message


def test_down_names_what_is_left_and_the_gpu_memory_it_holds(tmp_path: Path) -> None:
    with head_server() as port:
        fleet = fake_fleet(tmp_path, port=port)
        _up(fleet)
        node1 = fleet.nodes["node1"]
        # The busy H200's compute apps, pid 422 holding 8710 MiB, as a leftover of rank 1.
        node1.gpu_apps = (FIXTURES / "h200-device" / "compute-apps-busy.csv").read_text()
        node1.leftovers = [{"pid": 422, "command": "python3", "why": "it carries the instance's markers (it left "
                            "its rank's process group)", "started": 1.0, "rank": 1}]  # fmt: skip
        record = Deployments().get("fake")
        assert record is not None
        report = take_down(record, connect=fleet.connect)
        problem = report.problem()
        assert problem is not None and "node1: pid 422 (python3), rank 1: it carries the instance's markers" in problem
        lines = {m.node: m.describe({"422"}) for m in report.memory}
        assert "GPU compute apps: pid 422 python3 8710 MiB (left by this instance)" in lines["node1"]
        assert lines["node0"].endswith("no nvidia-smi") and "8.0 GiB before, 8.0 GiB after (+0 B)" in lines["node0"]
        assert Deployments().get("fake").status == "leftover"  # type: ignore[union-attr]
        with pytest.raises(LeftoverError, match="node1: pid 422") as raised:
            down(record, connect=fleet.connect)
        assert [(f.node, f.ident) for f in raised.value.report.leftovers] == [("node1", "422")]  # the report itself
        node1.leftovers = []
        assert down(record, connect=fleet.connect) == []
        assert Deployments().get("fake").status == "stopped"  # type: ignore[union-attr]


def test_the_stored_plan_round_trips_without_its_secrets(tmp_path: Path) -> None:
    planned = plan(load_recipe(SEEDS / "dsv41-flash-eugr-0913-4x"), load_cluster(SPARK4), "seed",
                   Overrides(env=(("HF_TOKEN", TOKEN),)))  # fmt: skip
    text = plan_to_json(planned)
    assert TOKEN not in text
    stored = plan_from_json(text)
    assert stored != planned and stored.ranks[0].argv == planned.ranks[0].argv
    assert with_secrets(stored, {r.rank: {"HF_TOKEN": TOKEN} for r in planned.ranks}) == planned
    with pytest.raises(StateError, match=r"cannot start rank 2 on .*: its env file .* is gone"):
        with_secrets(stored, {0: {"HF_TOKEN": TOKEN}, 1: {"HF_TOKEN": TOKEN}, 2: None})


def test_the_series_keeps_only_the_newest_rows() -> None:
    series = WatchSeries(limit=5)
    for i in range(8):
        series.add("bounded", [Sample(float(i), "node0", i, 1.0, "r0 running")])
    assert [r["mem_available"] for r in series.samples("bounded")] == [3, 4, 5, 6, 7]
