"""Fixtures for tests on real parts: a loopback fleet of sshd nodes, and the local dockerd."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import loopback_fleet
from tests.fleet.loopback import LoopbackFleet, pids_with_env

STANDIN = Path(__file__).resolve().parents[1] / "standin_engine.py"
HAVE_SSHD = shutil.which("sshd") is not None or os.path.exists("/usr/sbin/sshd")
needs_sshd = pytest.mark.skipif(not HAVE_SSHD, reason="openssh-server missing: run scripts/setup-system.sh")


def docker_ok() -> bool:
    return (
        shutil.which("docker") is not None
        and subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    )


needs_docker = pytest.mark.skipif(not docker_ok(), reason="no reachable dockerd: run scripts/start-dockerd.sh")


@pytest.fixture
def fleet4(tmp_path: Path) -> Iterator[LoopbackFleet]:
    """Four loopback nodes, each a real sshd on its own 127.0.0.x address."""
    if not HAVE_SSHD:
        pytest.skip("openssh-server missing")
    with loopback_fleet(4, tmp_path / "fleet") as fleet:
        yield fleet


@pytest.fixture
def fleet2(tmp_path: Path) -> Iterator[LoopbackFleet]:
    """Two loopback nodes."""
    if not HAVE_SSHD:
        pytest.skip("openssh-server missing")
    with loopback_fleet(2, tmp_path / "fleet") as fleet:
        yield fleet


@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    """A second local user of this machine, removed afterwards."""
    if os.getuid() != 0 or not shutil.which("useradd"):
        pytest.skip("creating a second local user needs root and useradd")
    name = f"sfmallory{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


def standin_recipe(folder: Path, *, nodes: int, port: int, env: dict[str, str] | None = None,
                   verify: str = "", image: str | None = None) -> Path:  # fmt: skip
    """A recipe whose ranks are the stand-in engine (ready at once, answers 42)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        'engine = "sglang"', 'model = "org/standin"', f"port = {port}", f"rendezvous_port = {port + 1}",
        f"required_nodes = {nodes}", f"tensor_parallel_size = {nodes}",
    ]  # fmt: skip
    if image:
        lines += [f'docker_image = "{image}"', 'entrypoint = ["python3", "/standin_engine.py"]']
    else:
        lines.append(f'entrypoint = ["{sys.executable}", "{STANDIN}"]')
    lines.append("[env]")
    lines += [f'{k} = "{v}"' for k, v in (env or {}).items()]
    if verify:
        lines += ["[verify]", verify]
    (folder / "recipe.toml").write_text("\n".join(lines) + "\n")
    return folder


def leftover_processes(name: str) -> list[int]:
    """Pids on this machine (every loopback node) that still belong to deployment name."""
    return pids_with_env(f"SPARKFLEET_DEPLOYMENT={name}")


def leftover_containers(name: str) -> list[str]:
    """Containers labelled with deployment name (any state)."""
    if not shutil.which("docker"):
        return []
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=sparkfleet.deployment={name}"],
                         capture_output=True, text=True)  # fmt: skip
    return out.stdout.split()


def sparkfleet(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would."""
    return subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})  # fmt: skip


@pytest.fixture
def sticky_tmp() -> Iterator[Path]:
    """A sticky, world-writable folder as /tmp is, of this test's own (the real /tmp holds other
    sessions' sockets): where another user, or unconfined code running as nobody, can write."""
    path = Path(tempfile.mkdtemp(prefix="sf-sticky-tmp-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
