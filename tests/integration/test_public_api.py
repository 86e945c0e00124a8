"""The library surface a script uses: load, plan, up, status, bench, down — on the local node with
a real stand-in rank, and a bench against a scripted SSE server."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import sparkfleet
from sparkfleet.errors import SparkfleetError
from sparkfleet.state.history import History
from sparkfleet.state.store import Store
from tests.integration.conftest import leftover_processes, standin_recipe
from tests.replay_server import ReplayServer, Script

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_load_plan_up_status_down_through_the_package(tmp_path: Path) -> None:
    recipe = sparkfleet.load_recipe(standin_recipe(tmp_path / "lib", nodes=1, port=_free_port()))
    cluster = sparkfleet.load_cluster(None)
    plan = sparkfleet.make_plan(recipe, cluster, name="lib-api", env={"STANDIN_ANSWER": "42"})
    assert plan.name == "lib-api" and [r.node.name for r in plan.ranks] == ["local"]
    assert ("STANDIN_ANSWER", "42", "cli") in [(v.key, v.value, v.source) for v in plan.ranks[0].env]
    ready = sparkfleet.up(plan, cluster, timeout=60)
    try:
        assert ready.name == "lib-api" and "42" in ready.smoke_answer
        # Recorded as the CLI's up is: `rollback` and the dashboard's history see it.
        (config,) = History(Store()).of("lib-api")
        assert config.id == ready.configuration and config.ready and config.recipe.endswith("recipe.toml")
        ranks = sparkfleet.status("lib-api")
        assert [(r.rank, r.state, r.health) for r in ranks] == [(0, "running", "healthy")]
    finally:
        stopped = sparkfleet.down("lib-api")
    assert stopped and leftover_processes("lib-api") == []
    with pytest.raises(SparkfleetError, match="no deployment named 'nope'"):
        sparkfleet.status("nope")


def test_bench_decode_through_the_package() -> None:
    with ReplayServer(Script(base_ttft=0.05, itl=0.01)).running() as srv:
        runs = sparkfleet.bench_decode(srv.url, concurrency=(1, 2), new_tokens=16, repeats=1)
    assert {r.concurrency for r in runs} == {1, 2}
    # Every request generated exactly the tokens asked for, as the server's usage says.
    assert all(rec.ok and rec.completion_tokens == 16 for r in runs for rec in r.records)
