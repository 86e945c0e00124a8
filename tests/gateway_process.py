"""`sparkfleet gateway serve` as a user starts it: a real process on a free port, its output kept in
a file (for the tests that grep everything for a key), stopped with SIGINT as Ctrl-C stops it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Running:
    url: str  # http://127.0.0.1:PORT/v1
    proc: subprocess.Popen[bytes]
    output: Path  # stdout and stderr together

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")


def cli(state: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The sparkfleet CLI against state dir ``state``."""
    return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "SPARKFLEET_STATE_DIR": str(state),
                                                "COLUMNS": "250"})  # fmt: skip


@contextmanager
def gateway(state: Path, *args: str, wait: float = 30) -> Iterator[Running]:
    """A gateway serving until the block ends (``--port 0`` unless args name one)."""
    output = state / f"gateway-{time.monotonic_ns()}.out"
    state.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "sparkfleet.cli.main", "gateway", "serve", *args]
    if "--port" not in args:
        argv += ["--port", "0"]
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(state), "COLUMNS": "250"}
    with output.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + wait
        url = None
        while url is None:
            m = re.search(r"gateway on (https?://\S+/v1)", output.read_text())
            if m:
                url = m.group(1)
            elif proc.poll() is not None:
                raise AssertionError(f"gateway exited {proc.returncode}: {output.read_text()}")
            elif time.monotonic() > deadline:
                raise AssertionError(f"gateway did not start in {wait} s: {output.read_text()}")
            else:
                time.sleep(0.05)
        yield Running(url, proc, output)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
