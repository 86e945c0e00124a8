"""``sparkfleet dashboard`` as a served process: who may talk to it, and what doctor leaves for it.

No browser here (tests/dashboard has those): plain HTTP against the real uvicorn server that
the CLI starts, on the state store the CLI writes.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.dashboard.conftest import free_port, start_dashboard
from tests.integration.conftest import leftover_processes, sparkfleet, standin_recipe


@contextmanager
def served(state: Path, *args: str, cwd: Path | None = None) -> Iterator[str]:
    """The address the dashboard printed (it ends in ?token=…)."""
    proc, url = start_dashboard(state, *args, cwd=cwd)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _base_and_auth(printed: str) -> tuple[str, dict[str, str]]:
    base, _, token = printed.partition("?token=")
    return base, {"Authorization": f"Bearer {token}"}


def _non_loopback_address() -> str | None:
    """An address of this machine other than loopback (the dashboard must guard it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


def test_loopback_needs_the_token_too_and_refuses_other_host_names(tmp_path: Path) -> None:
    with served(tmp_path) as printed:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{24,}", printed), printed
        url, auth = _base_and_auth(printed)
        # Any local user can connect to a loopback port: without the printed token, nothing.
        for path in ("", "api/deployments", "api/evals/runs"):
            assert httpx.get(url + path).status_code == 401, path
        assert httpx.post(url + "api/deployments/x/down", headers={"X-Sparkfleet-Action": "1"}).status_code == 401
        assert httpx.get(url + "api/deployments", headers=auth).json() == []
        assert "sparkfleet" in httpx.get(url, headers=auth).text
        # A web page that rebinds its own name onto 127.0.0.1 is refused (DNS rebinding).
        rebound = httpx.get(url + "api/deployments", headers={"Host": "attacker.example", **auth})
        assert rebound.status_code == 400


def test_another_local_users_post_is_refused(tmp_path: Path, other_user: pwd.struct_passwd) -> None:
    """A second local user, created by the test, cannot stop this user's deployment."""
    env = {"SPARKFLEET_STATE_DIR": str(tmp_path / "state")}
    name = f"mine-{os.getpid()}"
    recipe = standin_recipe(tmp_path / "r", nodes=1, port=free_port())
    assert sparkfleet("up", str(recipe), "--name", name, env=env).returncode == 0
    try:
        with served(tmp_path / "state") as printed:
            url, _ = _base_and_auth(printed)
            post = (
                "import sys, urllib.request, urllib.error\n"
                "req = urllib.request.Request(sys.argv[1], method='POST', headers={'X-Sparkfleet-Action': '1'})\n"
                "try:\n    print(urllib.request.urlopen(req, timeout=30).status)\n"
                "except urllib.error.HTTPError as e:\n    print(e.code)\n"
            )
            theirs = subprocess.run(["/usr/bin/python3", "-c", post, url + f"api/deployments/{name}/down"],
                                    capture_output=True, text=True, timeout=60, cwd="/",
                                    user=other_user.pw_uid, group=other_user.pw_gid, extra_groups=[])  # fmt: skip
            assert theirs.stdout.strip() == "401", theirs.stdout + theirs.stderr
        status = json.loads(sparkfleet("status", name, "--json", env=env).stdout)[0]
        assert status["status"] == "ready" and leftover_processes(name)
    finally:
        sparkfleet("down", name, env=env)
    assert leftover_processes(name) == []


def test_runs_are_served_by_id_not_by_path(tmp_path: Path) -> None:
    """A JSON file in the dashboard's working folder is not a run it serves."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    (folder / "planted.json").write_text(json.dumps({"id": "planted", "label": "planted", "results": []}))
    with served(tmp_path / "state", cwd=folder) as printed:
        url, auth = _base_and_auth(printed)
        answer = httpx.get(url + "api/evals/quality/planted.json", headers=auth)
    assert answer.status_code == 404, answer.text


def test_off_loopback_every_request_needs_the_token(tmp_path: Path) -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    with served(tmp_path, "--host", "0.0.0.0") as printed:
        token = printed.split("?token=", 1)[1]
        assert len(token) >= 24
        base = f"http://{address}:{printed.split(':')[2].split('/')[0]}/"
        for path in ("", "api/deployments", "api/bench/runs", "api/doctor", "static/dashboard.js"):
            refused = httpx.get(base + path)
            assert refused.status_code == 401, path
            assert "access token required" in refused.text
        assert httpx.get(base + "api/deployments", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(base + "api/deployments", headers={"Authorization": f"Bearer {token}"}).json() == []
        assert httpx.get(base + "?token=wrong").status_code == 401
        # The printed address works in a browser: the token becomes a cookie and leaves the address.
        with httpx.Client() as browser:
            first = browser.get(base + f"?token={token}")
            assert first.status_code == 303 and first.headers["location"] == base
            assert browser.get(base + "api/deployments").json() == []
        posted = httpx.post(base + "api/deployments/x/down", headers={"X-Sparkfleet-Action": "1"})
        assert posted.status_code == 401


def test_a_given_token_is_used_and_not_generated(tmp_path: Path) -> None:
    with served(tmp_path, "--host", "0.0.0.0", "--token", "correct-horse-battery") as printed:
        assert printed.endswith("?token=correct-horse-battery")


def test_actions_need_the_action_header(tmp_path: Path) -> None:
    # A cross-site form can POST but cannot add a header: without it nothing is attempted.
    with served(tmp_path) as printed:
        url, auth = _base_and_auth(printed)
        plain = httpx.post(url + "api/deployments/anything/down", headers=auth)
        assert plain.status_code == 403
        named = httpx.post(url + "api/deployments/anything/down", headers={"X-Sparkfleet-Action": "1", **auth})
        assert named.status_code == 404 and "no deployment named 'anything'" in named.json()["error"]


def test_doctor_leaves_each_nodes_last_run_for_the_dashboard(tmp_path: Path) -> None:
    env = {"SPARKFLEET_STATE_DIR": str(tmp_path)}
    printed = sparkfleet("doctor", "--json", env=env)
    assert printed.returncode in (0, 1), printed.stderr
    report = json.loads(printed.stdout)
    with served(tmp_path) as printed:
        url, auth = _base_and_auth(printed)
        nodes = httpx.get(url + "api/doctor", headers=auth).json()
    assert [n["node"] for n in nodes] == ["local"]
    shown = {c["id"]: (c["status"], c["evidence"]) for c in nodes[0]["checks"]}
    assert shown == {c["id"]: (c["status"], c["evidence"]) for c in report["checks"]}
    assert nodes[0]["counts"] == report["counts"]


def test_a_port_in_use_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        out = sparkfleet("dashboard", "--port", str(port), env={"SPARKFLEET_STATE_DIR": str(tmp_path)}, timeout=30)
    assert out.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


def test_without_the_extras_the_command_says_what_to_install(tmp_path: Path) -> None:
    # A Python that cannot import starlette: the message names the extra, not a traceback.
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('starlette', 'uvicorn'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    env = {"SPARKFLEET_STATE_DIR": str(tmp_path), "PYTHONPATH": str(tmp_path)}
    out = sparkfleet("dashboard", "--port", "0", env=env, timeout=30)
    assert out.returncode == 2
    assert "pip install 'sparkfleet[dashboard]'" in out.stderr


def test_restart_brings_back_the_stored_plan_with_its_sets(tmp_path: Path) -> None:
    # Brought up with --set: the recipe alone would plan another port. The restart brings up the
    # stored Plan (apply.restart, as watch does), so it serves on the port it had, as a new instance.
    env = {"SPARKFLEET_STATE_DIR": str(tmp_path / "state")}
    name = f"restart-guard-{os.getpid()}"
    port = free_port()
    recipe = standin_recipe(tmp_path / "r", nodes=1, port=free_port())
    assert sparkfleet("up", str(recipe), "--name", name, "--set", f"port={port}", env=env).returncode == 0
    try:
        before = json.loads(sparkfleet("status", name, "--json", env=env).stdout)[0]["instance"]
        with served(tmp_path / "state") as printed:
            url, auth = _base_and_auth(printed)
            answer = httpx.post(
                url + f"api/deployments/{name}/restart", headers={"X-Sparkfleet-Action": "1", **auth}, timeout=120
            )
        assert answer.status_code == 200, answer.text
        after = json.loads(sparkfleet("status", name, "--json", env=env).stdout)[0]
        assert after["status"] == "ready" and after["instance"] != before
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    finally:
        sparkfleet("down", name, env=env)
    assert leftover_processes(name) == []
