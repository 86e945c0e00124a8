"""A real engine failing while `sparkfleet up` waits for it: the 2-node vLLM CPU example on its
own loopback fleet, with rank 1's engine SIGKILLed during boot.

`up` must exit 2, roll back every rank on both nodes, and say which rank died where, with the
last lines of that rank's log. Own deployment name, ports and fleet: it runs beside (and never
touches) the session deployments of tests/e2e/conftest.py and a user's `gemma-llamacpp`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkfleet.config import caches
from tests.e2e.conftest import CACHE, HUB, ROOT, RUN, _require, free_ports
from tests.fleet import loopback_fleet
from tests.integration.conftest import leftover_processes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAME = f"test-e2e-vllm-kill-{RUN}"
# How long rank 1 runs before the kill. vLLM needs tens of seconds to boot on a 2-core machine
# (rank 0 cannot serve before rank 1 joins TP2), so a few seconds in it is still booting, and it
# has usually logged its first lines (the platform it detected) for the error to show.
KILL_AFTER_S = 4.0
# Once it appears, rank 1's log gets at most this long to receive a line before the kill anyway.
FIRST_LINE_S = 60.0


def _read_environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []  # it exited between the listing and the read


def _ppid(pid: int) -> int | None:
    try:
        # The command name in parentheses may hold spaces: the fields after its ")" are fixed.
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _squeezed(text: str) -> str:
    return "".join(text.split())


def rank_top_process(name: str, rank: int) -> int | None:
    """The top process of a rank of deployment name: the engine the node's monitor started.

    vLLM forks workers that inherit the markers; killing one of them would test something else.
    The top one is the marked process whose parent carries no marker of the deployment (the
    monitor itself does not), else the lowest pid.
    """
    ours = set(leftover_processes(name))
    marker = f"SPARKFLEET_RANK={rank}".encode()
    pids = sorted(pid for pid in ours if marker in _read_environ(pid))
    tops = [pid for pid in pids if _ppid(pid) not in ours]
    return (tops or pids)[0] if pids else None


def test_vllm_rank_killed_during_boot_rolls_back_and_names_it(tmp_path: Path) -> None:
    _require(CACHE / "venv-vllm" / "bin" / "vllm", "the vLLM CPU venv")
    _require(HUB / "models--sparkfleet--gemma3-270m", "the Gemma HF conversion")
    port, rendezvous = free_ports(2)
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}
    with loopback_fleet(2, tmp_path / "fleet", shared_hf_cache=caches.local_hf_cache()) as fleet:
        cluster = str(fleet.cluster_file)
        log_file = fleet.nodes[1].state_dir / "deployments" / NAME / "r1.log"
        # Files, not pipes: nobody reads up's output until it ends, and a full pipe would stall it.
        out_path, err_path = tmp_path / "up.out", tmp_path / "up.err"
        with out_path.open("w") as out, err_path.open("w") as err:
            up = subprocess.Popen(
                [sys.executable, "-m", "sparkfleet.cli.main", "up", str(ROOT / "examples" / "gemma-vllm-2node"),
                 "--name", NAME, "--set", f"port={port}", "--set", f"rendezvous_port={rendezvous}",
                 "--cluster", cluster],
                stdout=out, stderr=err, text=True, env=env,
            )  # fmt: skip
        try:
            victim = None
            deadline = time.monotonic() + 300  # preflight and start over ssh; generous on a busy machine
            while victim is None and up.poll() is None and time.monotonic() < deadline:
                victim = rank_top_process(NAME, 1)
                time.sleep(0.1)
            assert victim is not None, f"rank 1 never started:\n{err_path.read_text()[-3000:]}"
            seen = time.monotonic()
            time.sleep(KILL_AFTER_S)
            while time.monotonic() < seen + FIRST_LINE_S and not (log_file.exists() and log_file.read_text().strip()):
                time.sleep(0.5)
            assert up.poll() is None, f"up ended before rank 1 was killed:\n{err_path.read_text()[-3000:]}"
            os.kill(victim, signal.SIGKILL)
            up.wait(timeout=600)
            left = leftover_processes(NAME)
        finally:
            if up.poll() is None:
                up.kill()
                up.wait()
            if leftover_processes(NAME):  # a failed assertion above must not leave an engine behind
                subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", "down", NAME, "--cluster", cluster],
                               capture_output=True, env=env, timeout=120)  # fmt: skip
        log = log_file.read_text()
    stderr = err_path.read_text()
    assert up.returncode == 2, stderr
    assert left == [], f"processes of {NAME} left after the rollback: {left}"
    assert "rank 1 on node1 exited" in stderr and "during start-up" in stderr, stderr
    # The error shows the dead rank's own last log lines (the log is final: its engine is gone).
    # Compared without whitespace: the terminal output expands vLLM's tabs and may wrap lines.
    assert "last log lines:" in stderr, stderr
    shown = _squeezed(stderr.split("last log lines:", 1)[1])
    last = [line for line in log.splitlines() if line.strip()][-3:]
    assert last and all(_squeezed(line) in shown for line in last), f"log tail:\n{last}\nerror:\n{stderr}"
