"""The dashboard over runs against a real engine: Gemma 3 270M on llama.cpp, brought up with
``sparkfleet up`` (its own name and port, so it can run beside tests/e2e's session server).

Quality runs the same few tasks through the chat and the completions API (the base model says
nothing through chat, so outcomes differ on real answers); needle runs a small grid. No bench
here: llama-cpp-python's streams carry no token usage, which the bench refuses (the replay server
stands in for an engine in test_dashboard_pages).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkfleet.config import caches
from tests.dashboard.conftest import ROOT, RUN, cli, free_port, screenshot, start_dashboard
from tests.dashboard.test_dashboard_pages import chart, rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Where scripts/setup.sh put the engines and the model: the resolver the set-up itself uses.
CACHE = caches.engine_cache()
HUB = caches.hub_cache()
TASKS = "reason_handshakes,math_percent,format_one_word"
NAME = f"dash-gemma-{RUN}"


@pytest.fixture(scope="module")
def llama_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    for path, what in ((CACHE / "venv-llama" / "bin" / "python", "the llama.cpp venv"),
                       (HUB / "models--sparkfleet--gemma3-270m-gguf", "the Gemma GGUF")):  # fmt: skip
        if not path.exists():
            pytest.skip(f"{what} missing ({path}): run scripts/setup.sh")
    state = tmp_path_factory.mktemp("dash-llama") / "state"
    port = free_port()
    example = ROOT / "examples" / "gemma-llamacpp-python"
    cli(state, "up", str(example), "--name", NAME, "--set", f"port={port}", timeout=600)
    proc = None
    try:
        for api in ("chat", "completions"):
            cli(state, "eval", "quality", NAME, "--only", TASKS, "--api", api, "--label", f"gemma-{api}",
                "--timeout", "120", timeout=600)  # fmt: skip
        cli(state, "eval", "needle", NAME, "--input-len", "256", "--depths", "0,100", "--seed", "5",
            "--label", "gemma-needle", timeout=600)  # fmt: skip
        proc, url = start_dashboard(state)
        yield state, url
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        cli(state, "down", NAME)


def test_pages_show_the_real_engines_runs(llama_dashboard: tuple[Path, str], page: Any) -> None:
    state, url = llama_dashboard
    db = state / "state.db"
    page.goto(url + "#deployments")
    card = page.locator(f".deployment[data-name='{NAME}']")
    card.locator("td.state").get_by_text("running").wait_for()
    assert card.locator("td.health").inner_text() == "healthy"
    # The engine's own log: uvicorn's access lines (the page's health checks keep adding some).
    assert 'HTTP/1.1" 200 OK' in card.locator("pre.log").inner_text()
    screenshot(page, "llamacpp-deployments")

    page.goto(url + "#evals")
    results = {}
    for (row,) in (rows(db, "SELECT result_json FROM eval_runs WHERE label = ?", f"gemma-{api}")
                   for api in ("chat", "completions")):  # fmt: skip
        run = json.loads(row["result_json"])
        results[run["api"]] = run
    data = chart(page, "quality-chart")
    assert [d["runId"] for d in data["datasets"]] == [results["chat"]["id"], results["completions"]["id"]]
    chat = {r["id"]: r["passed"] for r in results["chat"]["results"]}
    flipped = sorted(r["id"] for r in results["completions"]["results"] if r["passed"] != chat[r["id"]])
    shown = page.locator("#flips tbody tr").evaluate_all("rows => rows.map((r) => r.dataset.task)")
    assert sorted(shown) == flipped
    (needle,) = rows(db, "SELECT result_json FROM eval_runs WHERE label = 'gemma-needle'")
    for cell in json.loads(needle["result_json"])["cells"]:
        td = page.locator(f"#needle-heatmap tr[data-depth='{cell['depth']:g}'] td[data-length='{cell['length']}']")
        assert td.get_attribute("class") == ("pass" if cell["passed"] else "fail")
    screenshot(page, "llamacpp-evals")
