"""The Watch page: the series and events `sparkfleet watch` recorded for a stand-in deployment
whose rank was SIGKILLed between two polls, drawn by the dashboard in headless Chromium."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from sparkfleet.state.deployments import Deployments
from sparkfleet.state.store import Store
from sparkfleet.state.watch_series import WatchSeries
from tests.dashboard.conftest import RUN, cli, screenshot, start_dashboard, up_standin
from tests.integration.conftest import leftover_processes


def test_watch_page_plots_each_nodes_series_and_the_events(page: Any, tmp_path: Path) -> None:
    state, name = tmp_path / "state", f"test-dash-watch-{RUN}"
    up_standin(state, tmp_path / "recipe", name, "42")
    try:
        cli(state, "watch", name, "--interval", "1", "--count", "2")
        engine = next(p for p in leftover_processes(name)
                      if b"standin_engine" in Path(f"/proc/{p}/cmdline").read_bytes())  # fmt: skip
        os.kill(engine, signal.SIGKILL)
        cli(state, "watch", name, "--interval", "1", "--count", "2")
        store = Store(state / "state.db")
        samples = WatchSeries(store).samples(name)
        assert len(samples) == 4 and all(s["mem_available"] for s in samples)
        events = [e for e in Deployments(store).events(name) if e["kind"] == "rank-exited"]
        assert len(events) == 1
        proc, url = start_dashboard(state)
        try:
            page.goto(url + "#watch")
            page.locator("#watch-events tr[data-kind='rank-exited']").wait_for()
            row = page.locator("#watch-events tr[data-kind='rank-exited']").inner_text()
            assert "rank 0 on local exited: exit code -9" in row
            drawn = page.evaluate(
                "() => ({mem: charts['watch-mem'].data.datasets.map((d) => [d.label, d.data]),"
                " labels: charts['watch-mem'].data.labels.length,"
                " running: charts['watch-running'].data.datasets.map((d) => d.label)})"
            )
            assert drawn["labels"] == 4 and [label for label, _ in drawn["mem"]] == ["local"]
            expected = [s["mem_available"] / 2**30 for s in samples]
            assert [round(v, 6) for v in drawn["mem"][0][1]] == [round(v, 6) for v in expected]
            # The stand-in exports no /metrics: nothing to plot for running requests, no made-up zeros.
            assert drawn["running"] == []
            screenshot(page, "watch")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    finally:
        cli(state, "down", name)
    assert leftover_processes(name) == []
