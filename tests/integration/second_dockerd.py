"""A second, private dockerd (own data root and socket): a "node" whose Docker daemon has
none of this machine's images. Used by the doctor and image tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def available() -> bool:
    """dockerd is installed, we are root, and the main daemon answers."""
    if os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0


@contextlib.contextmanager
def second_dockerd(timeout: float = 30.0) -> Iterator[str]:
    """Start a private dockerd; yield its DOCKER_HOST; stop it and remove its data."""
    # The socket path must stay short (108 bytes), so not under pytest's tmp_path.
    root = Path(tempfile.mkdtemp(prefix="sfd2"))
    sock = root / "sock"
    log = open(root / "log", "wb")  # noqa: SIM115 - dockerd writes to it until the finally block
    # Its own bridge: with --bridge=none dockerd deletes the host's docker0, breaking the main daemon.
    bridge = f"sfd2br{os.getpid() % 10000}"
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], capture_output=True, check=False)
    proc = subprocess.Popen(
        ["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "--pidfile", str(root / "pid"), "-H", f"unix://{sock}", f"--bridge={bridge}",
         "--iptables=false", "--ip-masq=false", "--storage-driver=vfs"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    host = f"unix://{sock}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            ok = subprocess.run(["docker", "-H", host, "version"], capture_output=True, timeout=10)
            if ok.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("second dockerd did not start: " + (root / "log").read_text()[-2000:])
            time.sleep(0.1)
        yield host
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
        subprocess.run(["rm", "-rf", str(root)], check=False)
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True, check=False)
