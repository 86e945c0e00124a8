"""A state store filled by real runs, the dashboard serving it, and a headless Chromium.

Everything the pages show is produced by the CLI as a user runs it: ``bench decode|prefill``
against two replay servers (tests/replay_server.py, real SSE over real sockets, one twice as
slow as the other), two stand-in deployments (tests/standin_engine.py, process runtime, local
cluster) brought up with ``sparkfleet up`` and evaluated with ``eval quality`` / ``eval needle``
(each answers a different number, so the two quality runs differ on known tasks), and
``sparkfleet doctor`` on this machine. The browser is Debian's Chromium driven by Playwright.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fleet import loopback_fleet
from tests.integration.conftest import HAVE_SSHD, standin_recipe
from tests.replay_server import ReplayServer, Script

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "dashboard"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Deployment names carry this run's pid: processes are found and stopped by deployment name, so
# two test runs on one machine (two engineers, say) must never share one.
RUN = str(os.getpid())
STAND_A, STAND_B = f"stand-a-{RUN}", f"stand-b-{RUN}"
# The two stand-ins answer these; math_percent expects 36 and math_speed 72, so they flip.
ANSWERS = {STAND_A: "36", STAND_B: "72"}
QUALITY_CATEGORIES = "math,reasoning,format"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(state: Path, *args: str, timeout: float = 180, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    """The sparkfleet CLI on state, as a user runs it; fails the test when it exits other than ok."""
    out = subprocess.run(
        [sys.executable, "-m", "sparkfleet.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "SPARKFLEET_STATE_DIR": str(state), "COLUMNS": "200"},
    )
    if out.returncode not in ok:
        pytest.fail(f"sparkfleet {' '.join(args)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return out


def up_standin(state: Path, folder: Path, name: str, answer: str, cluster: Path | None = None, nodes: int = 1) -> str:
    """Bring a stand-in up with ``sparkfleet up``; returns its endpoint."""
    port = free_port()
    recipe = standin_recipe(
        folder, nodes=nodes, port=port, env={"STANDIN_ANSWER": answer}, verify=f'smoke_expect = "{answer}"'
    )
    cli(state, "up", str(recipe), "--name", name, *(["--cluster", str(cluster)] if cluster else []), timeout=120)
    return str(json.loads(cli(state, "status", name, "--json").stdout)[0]["endpoint"])


@dataclass(frozen=True)
class Dashboard:
    """The state the runs filled and the dashboard serving it."""

    state: Path
    url: str
    endpoints: dict[str, str]

    @property
    def db(self) -> Path:
        return self.state / "state.db"


def start_dashboard(state: Path, *args: str, cwd: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    """``sparkfleet dashboard --port 0 ARGS``; returns the process and the address it printed
    (with its ``?token=``: a browser opening it gets the token as a cookie)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkfleet.cli.main", "dashboard", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "SPARKFLEET_STATE_DIR": str(state), "PYTHONUNBUFFERED": "1", "COLUMNS": "300"},
        cwd=cwd,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("dashboard on "):
            return proc, line.split()[2]
    proc.kill()
    raise AssertionError("the dashboard never said where it listens:\n" + "".join(lines))


@pytest.fixture(scope="session")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """The dashboard over a store filled by real bench, eval and doctor runs."""
    base = tmp_path_factory.mktemp("dashboard")
    state = base / "state"
    # Two bench subjects: the same scripted server, the second streaming at half the speed.
    for label, script in (("fast", Script(base_ttft=0.02, itl=0.02)), ("slow", Script(base_ttft=0.04, itl=0.04))):
        with ReplayServer(script).running() as srv:
            cli(state, "bench", "decode", srv.url, "--concurrency", "1,2,4", "--types", "prose,code",
                "--output-len", "16", "--repeats", "2", "--warmups", "0", "--label", label)  # fmt: skip
            cli(state, "bench", "prefill", srv.url, "--input-len", "256,512,1024", "--repeats", "1",
                "--overhead-samples", "1", "--label", label)  # fmt: skip
    stack = ExitStack()
    endpoints: dict[str, str] = {}
    proc = None
    try:
        # STAND_B spans two nodes of a loopback fleet (a real sshd each) when sshd is there, so the
        # page has ranks on different nodes to show.
        fleet = stack.enter_context(loopback_fleet(2, base / "fleet")) if HAVE_SSHD else None
        endpoints[STAND_A] = up_standin(state, base / "stand-a", STAND_A, ANSWERS[STAND_A])
        endpoints[STAND_B] = up_standin(
            state, base / "stand-b", STAND_B, ANSWERS[STAND_B],
            cluster=fleet.cluster_file if fleet else None, nodes=2 if fleet else 1,
        )  # fmt: skip
        for name, endpoint in endpoints.items():
            cli(state, "eval", "quality", endpoint, "--api", "completions", "--categories", QUALITY_CATEGORIES,
                "--label", f"answers-{ANSWERS[name]}")  # fmt: skip
        cli(state, "eval", "needle", endpoints[STAND_A], "--input-len", "256,512,1024", "--depths", "0,50,100",
            "--seed", "3", "--label", "needle-standin")  # fmt: skip
        cli(state, "doctor")
        if fleet is not None:
            # Exit 1 when a check fails, which the doctor page then shows; 2 would be an error.
            cli(state, "doctor", "--cluster", str(fleet.cluster_file), ok=(0, 1))
            # The pair test over the two loopback nodes (iperf3 between their 127.0.0.x addresses).
            cli(state, "doctor", "--fabric", "--fabric-seconds", "1", "--cluster", str(fleet.cluster_file), ok=(0, 1))
        proc, url = start_dashboard(state)
        yield Dashboard(state, url, endpoints)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        for name in endpoints:
            subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", "down", name], capture_output=True,
                           env={**os.environ, "SPARKFLEET_STATE_DIR": str(state)}, timeout=60)  # fmt: skip
        stack.close()


# Per module, not per session: sync Playwright keeps an asyncio loop running in this thread until
# it stops, and later tests (bench e2e) call asyncio.run(), which refuses to run inside one.
@pytest.fixture(scope="module")
def browser_context() -> Iterator[Any]:
    """Headless Debian Chromium with a new, empty profile."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is missing: run scripts/setup-browser.sh")
    try:
        from playwright.sync_api import sync_playwright  # heavy, and only these tests need it
    except ImportError:
        pytest.skip("playwright is missing: run scripts/setup-browser.sh")
    profile = tempfile.mkdtemp(prefix="sparkfleet-chromium-")
    try:
        with sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                profile,
                executable_path=str(CHROMIUM),
                args=CHROMIUM_FLAGS,
                headless=True,
                viewport={"width": 1400, "height": 1000},
            )
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser_context: Any) -> Iterator[Any]:
    """A fresh tab; any JavaScript error on it fails the test."""
    tab = browser_context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    yield tab
    tab.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def screenshot(page: Any, name: str) -> None:
    """Keep what the page looked like as a test artefact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
