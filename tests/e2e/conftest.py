"""Real engines serving Gemma 3 270M on CPU, brought up once per session with `sparkfleet up`.

The llama.cpp example runs on the local cluster; the vLLM example on a 2-node loopback fleet
(real sshd per node). Both skip, saying why, when scripts/setup.sh has not prepared the engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkfleet.spec import caches
from tests.fleet import loopback_fleet

ROOT = Path(__file__).resolve().parents[2]
# Where scripts/setup.sh put the engines and the model: the resolver the set-up itself uses.
CACHE = caches.engine_cache()
HUB = caches.hub_cache()


@dataclass(frozen=True)
class Served:
    """A deployment that is up: its name, endpoint, served model id and state dir."""

    name: str
    endpoint: str
    model: str
    state_dir: Path

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run the sparkfleet CLI against this deployment's state store."""
        return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True,
                              text=True, timeout=timeout,
                              env={**os.environ, "SPARKFLEET_STATE_DIR": str(self.state_dir)})  # fmt: skip


def _require(path: Path, what: str) -> None:
    if not path.exists():
        pytest.skip(f"{what} missing ({path}): run scripts/setup.sh")


def _up(name: str, recipe: Path, state: Path, cluster: Path | None, model: str) -> Iterator[Served]:
    served = Served(name, "", model, state)
    args = ["up", str(recipe)] + (["--cluster", str(cluster)] if cluster else [])
    out = served.cli(*args, timeout=900)
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
    """examples/gemma-llamacpp, up on this machine."""
    _require(CACHE / "venv-llama" / "bin" / "python", "the llama.cpp venv")
    _require(HUB / "models--sparkfleet--gemma3-270m-gguf", "the Gemma GGUF")
    yield from _up("gemma-llamacpp", ROOT / "examples" / "gemma-llamacpp",
                   tmp_path_factory.mktemp("llama-state"), None, "gemma3-270m")  # fmt: skip


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """examples/gemma-vllm-2node, up on a 2-node loopback fleet (TP2, rank 1 headless)."""
    _require(CACHE / "venv-vllm" / "bin" / "vllm", "the vLLM CPU venv")
    _require(HUB / "models--sparkfleet--gemma3-270m", "the Gemma HF conversion")
    with loopback_fleet(2, tmp_path_factory.mktemp("vllm-fleet"), shared_hf_cache=caches.local_hf_cache()) as fleet:
        yield from _up("gemma-vllm-2node", ROOT / "examples" / "gemma-vllm-2node",
                       tmp_path_factory.mktemp("vllm-state"), fleet.cluster_file, "gemma3-270m")  # fmt: skip


@pytest.fixture(scope="session")
def llama_url(llama_server: Served) -> str:
    """The llama.cpp example's endpoint (one deployment for every e2e test)."""
    return llama_server.endpoint


@pytest.fixture(scope="session")
def vllm_url(vllm_server: Served) -> str:
    """The 2-node vLLM example's endpoint (one deployment for every e2e test)."""
    return vllm_server.endpoint
