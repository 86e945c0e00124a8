"""Real engines serving Gemma 3 270M on CPU, brought up once per session with `sparkfleet up`.

The llama.cpp example runs on the local cluster; the vLLM example on a 2-node loopback fleet
(real sshd per node). Both skip, saying why, when scripts/setup.sh has not prepared the engine.

Each runs under its own deployment name and on free ports, never the examples' own
(`gemma-llamacpp` on 18080, `gemma-vllm-2node` on 18090/18091): the README's main command leaves
`gemma-llamacpp` serving, and `up` refuses a name that already runs under another instance or a
port that is taken — the tests must pass beside it and leave it serving.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkfleet.config import caches
from tests.fleet import loopback_fleet

ROOT = Path(__file__).resolve().parents[2]
# Where scripts/setup.sh put the engines and the model: the resolver the set-up itself uses.
CACHE = caches.engine_cache()
HUB = caches.hub_cache()
# Processes are found and stopped by deployment name, so the names carry this run's pid: two test
# runs on one machine never share one, and none is the name a user's deployment has.
RUN = str(os.getpid())
LLAMA_NAME = f"test-e2e-llama-{RUN}"
VLLM_NAME = f"test-e2e-vllm2-{RUN}"
# The vLLM example is started with an API key (VLLM_API_KEY, taken by `up --env VLLM_API_KEY` from
# the environment): every test that talks to it shows that its path sends the key. Tests reach it
# from their environment as a user would (`--api-key env:E2E_VLLM_KEY`, or OPENAI_API_KEY).
VLLM_KEY_ENV = "E2E_VLLM_KEY"
VLLM_KEY = f"sk-e2e-{secrets.token_hex(16)}"
os.environ[VLLM_KEY_ENV] = VLLM_KEY
VLLM_HEADERS = {"Authorization": f"Bearer {VLLM_KEY}"}


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free on this machine now (all held open together, so distinct)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


@dataclass(frozen=True)
class Served:
    """A deployment that is up: its name, endpoint, served model id and state dir."""

    name: str
    endpoint: str
    model: str
    state_dir: Path

    def cli(self, *args: str, timeout: float = 600, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run the sparkfleet CLI against this deployment's state store (env: added to this one's)."""
        env = {**os.environ, **(env or {}), "SPARKFLEET_STATE_DIR": str(self.state_dir)}
        return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True,
                              text=True, timeout=timeout, env=env)  # fmt: skip


def cli_at(state: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The sparkfleet CLI against the state store in state, as a user runs it."""
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(state), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)  # fmt: skip


def ok(out: subprocess.CompletedProcess[str]) -> str:
    """stdout of a command that must have succeeded (else its output, in the assertion)."""
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@contextlib.contextmanager
def watching(name: str, state: Path, out: Path) -> Iterator[subprocess.Popen[str]]:
    """`sparkfleet watch name --interval 2` running, its output in out; stopped (SIGTERM) after."""
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(state), "COLUMNS": "300"}
    argv = [sys.executable, "-m", "sparkfleet.cli.main", "watch", name, "--interval", "2"]
    with out.open("w") as fh:
        watch = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        yield watch
    finally:
        watch.send_signal(signal.SIGTERM)
        watch.wait(timeout=60)


def wait_for_line(watch: subprocess.Popen[str], out: Path, text: str, within: float = 240) -> str:
    """out's text once it holds text (watch still running), else fail showing its tail."""
    deadline = time.monotonic() + within
    while text not in out.read_text():
        assert watch.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.5)
    return out.read_text()


def _require(path: Path, what: str) -> None:
    if not path.exists():
        pytest.skip(f"{what} missing ({path}): run scripts/setup.sh")


def _up(name: str, recipe: Path, state: Path, cluster: Path | None, model: str,
        sets: list[str], env: dict[str, str] | None = None) -> Iterator[Served]:  # fmt: skip
    served = Served(name, "", model, state)
    args = ["up", str(recipe), "--name", name, *(a for s in sets for a in ("--set", s))]
    args += [a for key in env or {} for a in ("--env", key)]
    args += ["--cluster", str(cluster)] if cluster else []
    out = served.cli(*args, timeout=900, env=env)
    if out.returncode != 0:
        served.cli("down", name)
        pytest.fail(f"sparkfleet up {recipe.name} failed:\n{out.stderr[-4000:]}")
    status = json.loads(served.cli("status", name, "--json").stdout)[0]
    try:
        yield Served(name, status["endpoint"], model, state)
    finally:
        served.cli("down", name)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """examples/gemma-llamacpp, up on this machine (its own name and port)."""
    _require(CACHE / "venv-llama" / "bin" / "python", "the llama.cpp venv")
    _require(HUB / "models--sparkfleet--gemma3-270m-gguf", "the Gemma GGUF")
    # The plan reserves rank 0 an RPC port too (50052 by default), which preflight checks: free
    # ones for both, so nothing else on the machine can refuse this up.
    port, rpc = free_ports(2)
    yield from _up(LLAMA_NAME, ROOT / "examples" / "gemma-llamacpp-python", tmp_path_factory.mktemp("llama-state"),
                   None, "gemma3-270m", [f"port={port}", f"rendezvous_port={rpc}"])  # fmt: skip


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """examples/gemma-vllm-2node, up on a 2-node loopback fleet (TP2, rank 1 headless; own name, ports)."""
    _require(CACHE / "venv-vllm" / "bin" / "vllm", "the vLLM CPU venv")
    _require(HUB / "models--sparkfleet--gemma3-270m", "the Gemma HF conversion")
    with loopback_fleet(2, tmp_path_factory.mktemp("vllm-fleet"), shared_hf_cache=caches.local_hf_cache()) as fleet:
        port, rendezvous = free_ports(2)
        sets = [f"port={port}", f"rendezvous_port={rendezvous}"]
        # `up --env VLLM_API_KEY` takes the value from up's environment: never a word of argv.
        yield from _up(VLLM_NAME, ROOT / "examples" / "gemma-vllm-2node", tmp_path_factory.mktemp("vllm-state"),
                       fleet.cluster_file, "gemma3-270m", sets, env={"VLLM_API_KEY": VLLM_KEY})  # fmt: skip


@pytest.fixture(scope="session")
def llama_url(llama_server: Served) -> str:
    """The llama.cpp example's endpoint (one deployment for every e2e test)."""
    return llama_server.endpoint


@pytest.fixture(scope="session")
def vllm_url(vllm_server: Served) -> str:
    """The 2-node vLLM example's endpoint (one deployment for every e2e test)."""
    return vllm_server.endpoint


@contextlib.contextmanager
def up_in_background(name: str, recipe: Path, cluster: Path, sets: list[str], state: Path,
                     err_path: Path) -> Iterator[subprocess.Popen[str]]:  # fmt: skip
    """`sparkfleet up` of recipe as name, running while the test acts on its ranks (stderr to
    err_path: a full pipe nobody reads would stall it). Afterwards nothing of name is left, also
    when the test failed half-way: up is killed, and a `down` stops what it had started."""
    from tests.integration.conftest import leftover_processes

    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(state), "COLUMNS": "200"}
    argv = [sys.executable, "-m", "sparkfleet.cli.main", "up", str(recipe), "--name", name,
            "--cluster", str(cluster), *(a for s in sets for a in ("--set", s))]  # fmt: skip
    with err_path.open("w") as err:
        up = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env)
    try:
        yield up
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        if leftover_processes(name):
            subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", "down", name, "--cluster", str(cluster)],
                           capture_output=True, env=env, timeout=300)  # fmt: skip
