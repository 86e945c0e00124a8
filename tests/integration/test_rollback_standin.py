"""`sparkfleet rollback` over stand-in deployments (process runtime, this machine): it refuses,
saying why, while there is nothing to go back to, and otherwise takes the running configuration
down and brings the last one that passed its gate back up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from sparkfleet.dashboard.data import experiment, experiments
from sparkfleet.experiments.store import Experiments
from sparkfleet.state.deployments import Deployments
from sparkfleet.state.history import History
from sparkfleet.state.store import Store
from tests.integration.conftest import leftover_processes, standin_recipe

RUN = str(os.getpid())
VARIANTS = """
[variants.fast]
args_set = ["--standin-itl", "0.002"]
[variants.broken]
[variants.broken.env]
STANDIN_ANSWER = "41"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(state), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip


def _recipe(tmp_path: Path, name: str) -> Path:
    folder = standin_recipe(tmp_path / name, nodes=1, port=_free_port())
    (folder / "recipe.toml").write_text((folder / "recipe.toml").read_text() + VARIANTS)
    return folder


def _running_variant(state: Path, name: str) -> str:
    history = History(Store(state / "state.db"))
    record = Deployments(Store(state / "state.db")).get(name)
    assert record is not None and record.status == "ready"
    current = history.current(name, record.instance)
    assert current is not None
    return current.variant


def test_rollback_goes_back_to_the_last_passing_configuration(tmp_path: Path) -> None:
    name, state = f"test-rollback-{RUN}", tmp_path / "state"
    recipe = _recipe(tmp_path, name)
    try:
        refused = _cli(state, "rollback", name)
        assert refused.returncode == 2 and "no configuration of" in refused.stderr and "Traceback" not in refused.stderr
        assert _cli(state, "up", str(recipe), "--name", name).returncode == 0
        refused = _cli(state, "rollback", name)
        assert refused.returncode == 2, refused.stdout
        assert "the only configuration that passed its gate is the one running now" in " ".join(refused.stderr.split())
        assert _cli(state, "down", name).returncode == 0
        assert _cli(state, "up", str(recipe), "--name", name, "--variant", "fast").returncode == 0
        assert _running_variant(state, name) == "fast"
        back = _cli(state, "rollback", name)
        assert back.returncode == 0, back.stderr
        assert "rolled back" in back.stdout and "variant base" in back.stdout
        assert _running_variant(state, name) == "base"
        # A configuration that fails its gate (the smoke answer is wrong) is recorded as failed; the
        # rollback from it goes to the last passing one, not to itself.
        assert _cli(state, "down", name).returncode == 0
        failed = _cli(state, "up", str(recipe), "--name", name, "--variant", "broken")
        assert failed.returncode == 2 and "smoke test failed" in failed.stderr
        newest = History(Store(state / "state.db")).of(name)[0]
        assert (newest.variant, newest.ready, newest.passed) == ("broken", False, False)
        assert newest.recipe_digest and newest.image_ids == {}  # host processes: no image
        back = _cli(state, "rollback", name)
        assert back.returncode == 0, back.stderr
        assert _running_variant(state, name) == "base"
    finally:
        _cli(state, "down", name)
    assert leftover_processes(name) == []


def test_ctrl_c_takes_the_running_variant_down_and_keeps_finished_rounds(tmp_path: Path) -> None:
    name, state = f"test-ab-int-{RUN}", tmp_path / "state"
    recipe = _recipe(tmp_path, name)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkfleet.cli.main", "ab", str(recipe), "--variants", "base,fast", "--name", name,
         "--rounds", "5", "--output-len", "64", "--repeats", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SPARKFLEET_STATE_DIR": str(state)},
    )  # fmt: skip
    store = Store(state / "state.db")
    deadline = time.monotonic() + 120
    # Wait until round 1 is finished and round 2's first variant is being measured.
    while time.monotonic() < deadline:
        parts = Experiments(store).rounds(1) if (state / "state.db").exists() else []
        record = Deployments(store).get(name) if parts else None
        if len(parts) >= 2 and record is not None and record.status == "ready":
            break
        time.sleep(0.2)
    else:
        proc.kill()
        raise AssertionError("the experiment never reached round 2")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert leftover_processes(name) == []
    stored = Experiments(store).get(1)
    assert stored.status == "interrupted" and stored.report is not None and stored.report["rounds"] >= 1
    assert "decode prose/c1 tok/s" in out  # the report of the finished rounds was printed
    listed = experiments(store)
    assert listed[0]["status"] == "interrupted" and listed[0]["variants"] == ["base", "fast"]
    assert experiment(store, 1)["metrics"][0]["name"] == "time to ready"
