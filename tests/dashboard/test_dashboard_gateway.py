"""The Gateway page: a stand-in deployment brought up with `sparkfleet up`, a key, requests sent
through `sparkfleet gateway serve` with the openai client (one refused), and the page in headless
Chromium showing the route, the key by name and the logged requests, never the key itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.dashboard.conftest import RUN, cli, screenshot, start_dashboard, up_standin
from tests.gateway_process import gateway


def test_gateway_page_shows_routes_keys_and_requests(page: Any, tmp_path: Path) -> None:
    state, name = tmp_path / "state", f"test-dash-gw-{RUN}"
    up_standin(state, tmp_path / "recipe", name, "42")
    try:
        key = cli(state, "gateway", "key", "create", "dash-user").stdout.strip()
        with gateway(state) as gw:
            client = openai.OpenAI(base_url=gw.url, api_key=key, max_retries=0)
            answer = client.completions.create(model="org/standin", prompt="x", max_tokens=5)
            assert answer.choices[0].text == " t0 t1 t2 t3 t4"
            with pytest.raises(openai.NotFoundError):
                client.completions.create(model="org/nothing", prompt="x", max_tokens=5)
            proc, url = start_dashboard(state)
            try:
                page.goto(url + "#gateway")
                page.locator("#gateway-requests tbody tr").first.wait_for()
                routes = page.locator("#gateway-routes").inner_text()
                assert "org/standin" in routes and name in routes and "32768" in routes
                assert "dash-user" in page.locator("#gateway-keys").inner_text()
                rows = page.locator("#gateway-requests tbody tr").all_inner_texts()
                assert len(rows) == 2
                assert "404" in rows[0] and "org/nothing" in rows[0]
                assert "200" in rows[1] and "dash-user" in rows[1] and "5+5" in rows[1]
                # `down` behind the running gateway drains first; the page's Changes table says so.
                assert cli(state, "down", name).returncode == 0
                page.goto(url + "#deployments")
                page.goto(url + "#gateway")
                page.locator("#gateway-changes").get_by_text("drained").first.wait_for()
                changes = page.locator("#gateway-changes").inner_text()
                assert "drained" in changes and name in changes
                assert key.split("-", 2)[2] not in page.content()
                screenshot(page, "gateway")
            finally:
                proc.kill()
                proc.wait()
    finally:
        cli(state, "down", name)
