"""`export slurm` for real: the sbatch script brings the llama.cpp Gemma example to ready on a
single-host Slurm (scripts/start-slurm.sh), serves a completion, and fails fast when a rank dies."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from sparkfleet.config import caches
from sparkfleet.config.recipe import load_recipe
from sparkfleet.exporters.slurm import SlurmOptions, slurm_script
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "gemma-llamacpp-python"
VENV_PY = caches.engine_cache() / "venv-llama" / "bin" / "python"

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _gguf_present() -> bool:
    return any(caches.hub_cache().glob("models--sparkfleet--gemma3-270m-gguf/snapshots/*/gemma-3-270m-Q4_K_M.gguf"))


@pytest.fixture(scope="module")
def slurm() -> None:
    if os.geteuid() != 0 and not shutil.which("slurmctld"):
        pytest.skip("Slurm is not installed and installing it needs root")
    done = subprocess.run([str(ROOT / "scripts" / "start-slurm.sh")], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"start-slurm.sh failed:\n{done.stdout}\n{done.stderr}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def _sbatch(script: Path, out: Path) -> str:
    done = subprocess.run(["sbatch", "--parsable", f"--output={out}", str(script)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip().split(";")[0]


def _job_state(job: str) -> str:
    done = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True)
    m = re.search(r"JobState=(\S+)", done.stdout)
    return m.group(1) if m else "GONE"


def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _cancel(job: str) -> None:
    subprocess.run(["scancel", job], check=False)
    _wait_for(lambda: _job_state(job) not in ("RUNNING", "PENDING", "COMPLETING"), 60, f"job {job} to end")


@pytest.mark.e2e
@pytest.mark.skipif(not VENV_PY.exists() or not _gguf_present(),
                    reason="needs scripts/setup-engines.sh llama and scripts/prepare-model.py")  # fmt: skip
def test_exported_script_brings_gemma_to_ready_on_local_slurm(slurm: None, tmp_path: Path) -> None:
    port = _free_port()  # not the example's own port: other tests may be serving it
    script = tmp_path / "gemma.sbatch"
    script.write_text(slurm_script(load_recipe(EXAMPLE, (f"port={port}",)), "gemma-slurm-test"))
    out = tmp_path / "job.out"
    job = _sbatch(script, out)
    try:
        ready = re.compile(r"sparkfleet: gemma-slurm-test ready at (http://\S+) \(job (\d+)\)")
        _wait_for(lambda: out.exists() and ready.search(out.read_text()), 240, "the ready line")
        m = ready.search(out.read_text())
        assert m and m.group(2) == job and _job_state(job) == "RUNNING"
        body = {"prompt": "The capital of France is Paris. The capital of Germany is", "max_tokens": 8,
                "temperature": 0}  # fmt: skip
        request = urllib.request.Request(f"{m.group(1)}/v1/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as response:
            text = json.load(response)["choices"][0]["text"]
        assert "Berlin" in text
        log = out.read_text()
        assert "sparkfleet: rank 0 on" in log and f"Uvicorn running on http://0.0.0.0:{port}" in log
        assert m.group(1).endswith(f":{port}")
    finally:
        _cancel(job)

    def released() -> bool:
        return f":{port} " not in subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout

    _wait_for(released, 30, "the engine to release its port")


def test_script_fails_fast_when_rank_zero_exits(slurm: None, tmp_path: Path) -> None:
    # A real process that exits at once: the readiness wait must notice instead of waiting 300 s.
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        f'engine = "llama-cpp"\nmodel = "/nonexistent"\nmodel_file = "missing.gguf"\nport = {_free_port()}\n'
        'entrypoint = ["python3", "-c", "import sys; print(sys.argv[1:]); sys.exit(3)"]\n'
        "[verify]\ntimeout = 300\n"
    )
    script = tmp_path / "fail.sbatch"
    script.write_text(slurm_script(load_recipe(recipe), "fail-test"))
    out = tmp_path / "job.out"
    started = time.monotonic()
    job = _sbatch(script, out)
    try:
        _wait_for(lambda: _job_state(job) in ("FAILED", "COMPLETED", "CANCELLED", "GONE"), 90, "the job to end")
    finally:
        _cancel(job)
    assert time.monotonic() - started < 60
    assert _job_state(job) in ("FAILED", "GONE")
    text = out.read_text()
    assert "ranks exited" in text and "before http://" in text
    assert "--model /nonexistent/missing.gguf" in text or "'/nonexistent/missing.gguf'" in text


def _docker_image_present(image: str) -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0


@pytest.mark.skipif(not _docker_image_present("sparkfleet-test:latest"),
                    reason="needs dockerd and scripts/build-test-image.sh")  # fmt: skip
def test_docker_rank_runs_in_a_foreground_container_removed_on_scancel(slurm: None, tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        f'engine = "sglang"\nmodel = "org/model"\ndocker_image = "sparkfleet-test:latest"\nport = {_free_port()}\n'
        'entrypoint = ["standin-rank"]\n[env]\nSTANDIN_DELAY = "2"\nMY_KNOB = "two words"\n'
    )
    script = tmp_path / "docker.sbatch"
    # An SGLang recipe asks each node for its GPU by default; this Slurm node has none.
    script.write_text(slurm_script(load_recipe(recipe), "docker-test", SlurmOptions(gpus_per_node=0)))
    out = tmp_path / "job.out"
    job = _sbatch(script, out)
    name = "sparkfleet-docker-test-r0"
    try:
        _wait_for(lambda: out.exists() and "docker-test ready at" in out.read_text(), 90, "the ready line")
        inspect = subprocess.run(["docker", "inspect", name, "--format", "{{json .Config.Env}}"],
                                 capture_output=True, text=True, check=True)  # fmt: skip
        env = json.loads(inspect.stdout)
        assert "MY_KNOB=two words" in env and "HF_HUB_OFFLINE=1" in env
        url = re.search(r"ready at (http://\S+)", out.read_text()).group(1)  # type: ignore[union-attr]
        request = urllib.request.Request(f"{url}/v1/completions", b'{"prompt": "19+23=", "max_tokens": 4}',
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            assert "42" in json.load(response)["choices"][0]["text"]
    finally:
        _cancel(job)

    def removed() -> bool:
        ps = subprocess.run(["docker", "ps", "-a", "-q", "--filter", f"name=^{name}$"], capture_output=True, text=True)
        return ps.stdout.strip() == ""

    _wait_for(removed, 30, "the rank's container to be removed")
