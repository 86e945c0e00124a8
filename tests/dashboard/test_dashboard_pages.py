"""The dashboard in a real headless Chromium, over data made by real bench, eval and doctor runs.

What the charts draw is read back from the page (Chart.js's own data) and compared with the
figures recomputed here straight from the SQLite rows the CLI wrote.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.dashboard.conftest import RUN, STAND_A, STAND_B, Dashboard, cli, screenshot, start_dashboard, up_standin
from tests.integration.conftest import leftover_processes

pytestmark = pytest.mark.slow

CHART_DATA = """(id) => {
  const chart = Chart.getChart(id);
  return chart && {labels: chart.data.labels,
                   datasets: chart.data.datasets.map((d) => ({label: d.label, runId: d.runId, data: d.data}))};
}"""


def rows(db: Path, sql: str, *args: Any) -> list[sqlite3.Row]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def stored_bench(db: Path, label: str, kind: str) -> tuple[int, dict[str, float]]:
    """A bench run's id and, per tier, the median headline figure over its repeats."""
    (run,) = rows(db, "SELECT id FROM bench_runs WHERE label = ? AND kind = ?", label, kind)
    key = "steady_tps" if kind == "decode" else "rate"
    by_tier: dict[str, list[float]] = {}
    for r in rows(db, "SELECT tier, metrics FROM bench_samples WHERE run_id = ?", run["id"]):
        by_tier.setdefault(r["tier"], []).append(json.loads(r["metrics"])[key])
    return run["id"], {tier: statistics.median(v) for tier, v in by_tier.items()}


def stored_eval(db: Path, label: str) -> dict[str, Any]:
    (row,) = rows(db, "SELECT result_json FROM eval_runs WHERE label = ?", label)
    return dict(json.loads(row["result_json"]))


def chart(page: Any, canvas_id: str) -> dict[str, Any]:
    page.wait_for_function("(id) => Chart.getChart(id) !== undefined", arg=canvas_id)
    data: dict[str, Any] = page.evaluate(CHART_DATA, canvas_id)
    return data


def test_deployments_page_shows_every_rank_live(dashboard: Dashboard, page: Any) -> None:
    page.goto(dashboard.url + "#deployments")
    for name in (STAND_A, STAND_B):
        card = page.locator(f".deployment[data-name='{name}']")
        card.locator("td.state").first.get_by_text("running").wait_for()
        assert card.locator("h3 .badge").inner_text() == "ready"
        (row,) = rows(dashboard.db, "SELECT ranks_json FROM deployments WHERE name = ?", name)
        ranks = json.loads(row["ranks_json"])
        assert card.locator("tbody tr").count() == len(ranks)
        for rank in ranks:
            cells = card.locator(f"tr[data-rank='{rank['rank']}'] td")
            assert cells.nth(1).inner_text().splitlines()[0] == rank["node"]["name"]
            assert cells.nth(2).inner_text().splitlines()[0] == "running"
            assert cells.nth(3).inner_text().endswith(" s")  # uptime
            # The head answers its health route; a worker is alive when its process runs.
            assert cells.nth(4).inner_text() == ("healthy" if rank["rank"] == 0 else "alive")
            log = cells.nth(5).inner_text()
            assert "fired up and ready" in log if rank["rank"] == 0 else "standin worker ready" in log
    # It refreshes by itself: the uptime moves on without a reload.
    first = page.locator("#deployments").get_attribute("data-loaded")
    page.wait_for_function(
        "(t) => document.querySelector('#deployments').dataset.loaded !== t", arg=first, timeout=10000
    )
    screenshot(page, "deployments")


def test_bench_charts_draw_the_stored_medians_of_both_runs(dashboard: Dashboard, page: Any) -> None:
    page.goto(dashboard.url + "#bench")
    fast_id, fast = stored_bench(dashboard.db, "fast", "decode")
    slow_id, slow = stored_bench(dashboard.db, "slow", "decode")
    for ptype in ("prose", "code"):
        data = chart(page, f"decode-chart-{ptype}")
        assert data["labels"] == [1, 2, 4]
        # The page opens comparing the two newest runs: the older is A, the newer B.
        assert [d["runId"] for d in data["datasets"]] == [fast_id, slow_id]
        for dataset, stored in zip(data["datasets"], (fast, slow), strict=True):
            assert dataset["data"] == pytest.approx([stored[f"{ptype}/c{c}"] for c in (1, 2, 4)], rel=1e-9)
        # What a user sees: the server streaming twice as slowly gives half the tok/s at every tier.
        for a, b in zip(data["datasets"][0]["data"], data["datasets"][1]["data"], strict=True):
            assert b / a == pytest.approx(0.5, rel=0.15)
    fast_id, fast = stored_bench(dashboard.db, "fast", "prefill")
    slow_id, slow = stored_bench(dashboard.db, "slow", "prefill")
    data = chart(page, "prefill-chart-prefill")
    assert data["labels"] == [256, 512, 1024]
    assert [d["runId"] for d in data["datasets"]] == [fast_id, slow_id]
    for dataset, stored in zip(data["datasets"], (fast, slow), strict=True):
        assert dataset["data"] == pytest.approx([stored[str(n)] for n in (256, 512, 1024)], rel=1e-9)
    screenshot(page, "bench")
    # Picking no run B leaves run A alone on the chart.
    page.select_option("#decode-b", "")
    page.wait_for_function("() => Chart.getChart('decode-chart-prose')?.data.datasets.length === 1")
    fast_id, slow_id = stored_bench(dashboard.db, "fast", "decode")[0], stored_bench(dashboard.db, "slow", "decode")[0]
    assert [d["runId"] for d in chart(page, "decode-chart-prose")["datasets"]] == [fast_id]
    # The history lists every run; its B button puts that run back beside A.
    assert page.locator("#bench-runs tbody tr").count() == len(rows(dashboard.db, "SELECT id FROM bench_runs"))
    page.click(f"#bench-runs tr[data-run='{slow_id}'] button[data-put='B']")
    page.wait_for_function("() => Chart.getChart('decode-chart-prose')?.data.datasets.length === 2")
    assert [d["runId"] for d in chart(page, "decode-chart-prose")["datasets"]] == [fast_id, slow_id]


def test_quality_compare_shows_both_runs_and_the_flips(dashboard: Dashboard, page: Any) -> None:
    page.goto(dashboard.url + "#evals")
    a, b = stored_eval(dashboard.db, "answers-36"), stored_eval(dashboard.db, "answers-72")
    data = chart(page, "quality-chart")
    categories = [c for c in ("math", "reasoning", "format")]
    assert data["labels"] == categories
    assert [d["runId"] for d in data["datasets"]] == [a["id"], b["id"]]
    for dataset, run in zip(data["datasets"], (a, b), strict=True):
        expected = []
        for cat in categories:
            results = [r for r in run["results"] if r["category"] == cat]
            expected.append(100 * sum(r["passed"] for r in results) / len(results))
        assert dataset["data"] == pytest.approx(expected)
    summary = page.locator("#quality-summary").inner_text()
    assert "A: answers-36" in summary and "B: answers-72" in summary
    # The flips are exactly the tasks whose outcome differs between the stored runs.
    b_passed = {r["id"]: r["passed"] for r in b["results"]}
    flipped = {r["id"]: "broke" if r["passed"] else "fixed" for r in a["results"] if r["passed"] != b_passed[r["id"]]}
    assert flipped["math_percent"] == "broke" and flipped["math_speed"] == "fixed"  # 36 and 72 are their answers
    shown = page.locator("#flips tbody tr")
    assert shown.count() == len(flipped)
    for task, direction in flipped.items():
        arrow = "A pass → B fail" if direction == "broke" else "A fail → B pass"
        assert page.locator(f"#flips tr[data-task='{task}'] td").nth(2).inner_text() == arrow
    assert page.locator(".verdict").inner_text().startswith("noise:")


def test_needle_heatmap_matches_the_stored_cells(dashboard: Dashboard, page: Any) -> None:
    page.goto(dashboard.url + "#evals")
    page.locator("#needle-heatmap").wait_for()
    run = stored_eval(dashboard.db, "needle-standin")
    assert len(run["cells"]) == 9
    for cell in run["cells"]:
        td = page.locator(f"#needle-heatmap tr[data-depth='{cell['depth']:g}'] td[data-length='{cell['length']}']")
        assert td.get_attribute("class") == ("pass" if cell["passed"] else "fail")
    assert "effective length none" in page.locator("#needle").inner_text()
    screenshot(page, "evals")


def test_doctor_page_shows_each_nodes_last_run(dashboard: Dashboard, page: Any) -> None:
    page.goto(dashboard.url + "#doctor")
    page.locator(".doctor-node").first.wait_for()
    stored = {r["node"]: json.loads(r["checks_json"]) for r in rows(dashboard.db, "SELECT * FROM doctor_last")}
    assert "local" in stored and all(stored.values()), "sparkfleet doctor recorded no checks"
    assert page.locator(".doctor-node").evaluate_all("cards => cards.map((c) => c.dataset.node)") == sorted(
        stored, key=lambda n: (n == "fleet", n)
    )
    for node, checks in stored.items():
        card = page.locator(f".doctor-node[data-node='{node}']")
        for check in checks:
            cells = card.locator(f"tr[data-check='{check['id']}'] td")
            assert cells.nth(0).inner_text() == check["status"]
            assert cells.nth(2).inner_text() == check["evidence"]
            assert cells.nth(3).inner_text() == ("" if check["status"] == "pass" else check["fix"])
        failed = sum(c["status"] == "fail" for c in checks)
        assert f" {failed} failed," in " " + card.locator("h3 span.muted").inner_text()
    screenshot(page, "doctor")


def test_doctor_page_draws_the_last_fabric_matrix_as_a_heatmap(dashboard: Dashboard, page: Any) -> None:
    (row,) = rows(dashboard.db, "SELECT report_json FROM doctor_fabric ORDER BY id DESC LIMIT 1")
    report = json.loads(row["report_json"])
    page.goto(dashboard.url + "#doctor")
    page.locator("table.fabric-matrix td.heat").first.wait_for()
    median, fraction = report["median_mbps"], report["thresholds"]["fraction"]
    gbit = median >= 1000
    for p in report["pairs"]:
        for src, dst, rate in ((p["a"], p["b"], p["forward_mbps"]), (p["b"], p["a"], p["reverse_mbps"])):
            cell = page.locator(f"table.fabric-matrix td[data-src='{src}'][data-dst='{dst}']")
            assert cell.inner_text() == (f"{rate / 1000:.2f}" if gbit else f"{rate:.1f}")
            assert ("below" in (cell.get_attribute("class") or "")) == (rate / median < fraction)
    unit = "Gbit/s" if gbit else "Mbit/s"
    assert f"bandwidth, {unit}, row sends to column" in page.locator(".card.fabric h3").inner_text()
    screenshot(page, "doctor-fabric")


def _serves(endpoint: str) -> bool:
    try:
        return httpx.get(endpoint + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _status(db: Path, name: str) -> str:
    (row,) = rows(db, "SELECT status FROM deployments WHERE name = ?", name)
    return str(row["status"])


def test_actions_ask_first_and_then_do_what_the_cli_does(dashboard: Dashboard, page: Any, tmp_path: Path) -> None:
    name = f"stand-act-{RUN}"
    endpoint = up_standin(dashboard.state, tmp_path / name, name, "7")
    before = leftover_processes(name)
    assert before and _serves(endpoint)
    page.goto(dashboard.url + "#deployments")
    card = page.locator(f".deployment[data-name='{name}']")
    card.locator("td.state").get_by_text("running").wait_for()
    dialog = page.locator("dialog#confirm")

    # Restart, dismissed: nothing happens.
    card.locator("button[data-action='restart']").click()
    assert dialog.is_visible() and f"Restart {name}?" in dialog.inner_text()
    page.click("#confirm-cancel")
    assert not dialog.is_visible()
    page.wait_for_timeout(1000)
    assert leftover_processes(name) == before and _status(dashboard.db, name) == "ready"

    # Restart, accepted: new processes, serving again.
    card.locator("button[data-action='restart']").click()
    page.click("#confirm-ok")
    page.locator(f"#action-{name}").get_by_text(f"up again at {endpoint}").wait_for(timeout=60000)
    card.locator("h3 .badge").get_by_text("ready").wait_for()
    card.locator("td.state").get_by_text("running").wait_for()
    after = leftover_processes(name)
    assert after and set(after).isdisjoint(before) and _serves(endpoint)

    # Down, dismissed: still serving.
    card.locator("button[data-action='down']").click()
    assert "sparkfleet down" in dialog.inner_text()
    screenshot(page, "confirm-down")
    page.click("#confirm-cancel")
    page.wait_for_timeout(1000)
    assert _serves(endpoint) and _status(dashboard.db, name) == "ready"

    # Down, accepted: every rank is gone and the record says so, as after `sparkfleet down`.
    card.locator("button[data-action='down']").click()
    page.click("#confirm-ok")
    card.locator("h3 .badge").get_by_text("stopped").wait_for(timeout=30000)
    assert _status(dashboard.db, name) == "stopped"
    assert leftover_processes(name) == [] and not _serves(endpoint)
    shown = cli(dashboard.state, "status", name).stdout
    assert "stopped" in shown


def test_an_empty_store_says_how_to_fill_each_page(page: Any, tmp_path: Path) -> None:
    proc, url = start_dashboard(tmp_path / "empty")
    try:
        expected = {
            "deployments": "`sparkfleet up RECIPE` starts one",
            "bench": "`sparkfleet bench decode` makes one",
            "evals": "`sparkfleet eval needle` makes one",
            "doctor": "`sparkfleet doctor` makes one",
        }
        for name, hint in expected.items():
            page.goto(f"{url}#{name}")
            page.locator(f"#page-{name}").get_by_text(hint).wait_for()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
