"""The code sandbox against hostile code: writes outside, network, memory, CPU, escapes.

Real subprocesses and real namespaces; nothing mocked. Where this OS refuses namespaces the
containment tests are skipped with the sandbox's own notice, never passed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sparkfleet.evals.sandbox import SandboxLimits, SandboxResult, run_python

FAST = SandboxLimits(wall_s=8, cpu_s=3, memory_mb=256)


@pytest.fixture(scope="module")
def isolated() -> SandboxResult:
    probe = run_python("pass", FAST)
    if not probe.isolated:
        pytest.skip(f"this OS gives the sandbox no namespaces: {probe.isolation}")
    return probe


def test_plain_code_runs_and_sees_an_isolated_interpreter(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "print(sys.flags.isolated, sys.flags.no_site)\n"
        "print(os.getcwd() == os.environ['HOME'])\n"
        "print('PYTHONPATH' in os.environ, 'SECRET_TOKEN' in os.environ)\n"
    )
    os.environ["SECRET_TOKEN"] = "do-not-leak"
    try:
        result = run_python(code, FAST)
    finally:
        del os.environ["SECRET_TOKEN"]
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["1 1", "True", "False False"]


def test_writes_outside_the_work_dir_are_refused(isolated: SandboxResult, tmp_path: Path) -> None:
    victim = tmp_path / "precious.txt"
    victim.write_text("original")
    new_file = tmp_path / "planted.txt"
    code = (
        "import os, shutil\n"
        "errors = 0\n"
        f"for action in (lambda: open({str(new_file)!r}, 'w').write('x'),\n"
        f"               lambda: open({str(victim)!r}, 'w').write('overwritten'),\n"
        f"               lambda: os.remove({str(victim)!r}),\n"
        f"               lambda: os.chmod({str(victim)!r}, 0o777),\n"
        "               lambda: open('/dev/shm/sparkfleet-planted', 'w').write('x'),\n"
        "               lambda: open('/root/.sparkfleet-planted', 'w').write('x')):\n"
        "    try:\n"
        "        action()\n"
        "    except OSError:\n"
        "        errors += 1\n"
        "open('inside.txt', 'w').write('fine')\n"
        "print(errors, open('inside.txt').read())\n"
    )
    result = run_python(code, FAST)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "6 fine"
    assert victim.read_text() == "original"
    assert oct(victim.stat().st_mode & 0o777) != oct(0o777)
    assert not new_file.exists()
    assert not Path("/dev/shm/sparkfleet-planted").exists()
    assert not Path("/root/.sparkfleet-planted").exists()


def test_cannot_remount_writable(isolated: SandboxResult, tmp_path: Path) -> None:
    target = tmp_path / "after-remount.txt"
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.mount(None, b'/', None, 32 | 4096, None)\n"  # MS_REMOUNT|MS_BIND, i.e. read-write
        "print('remount', rc, os.strerror(ctypes.get_errno()))\n"
        f"open({str(target)!r}, 'w').write('x')\n"
    )
    result = run_python(code, FAST)
    assert "remount -1" in result.stdout
    assert result.exit_code != 0
    assert not target.exists()


def test_no_network_not_even_loopback(isolated: SandboxResult) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(6)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            accepted.append(server.accept())

    thread = threading.Thread(target=accept)
    thread.start()
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    result = run_python(code, FAST)
    thread.join()
    server.close()
    assert accepted == []
    assert result.stdout.startswith("refused"), result.stdout + result.stderr


def test_unbounded_allocation_is_stopped() -> None:
    start = time.monotonic()
    result = run_python("x = []\nwhile True:\n    x.append(bytearray(10**7))\n", FAST)
    assert result.exit_code != 0
    assert not result.timed_out
    assert "MemoryError" in result.stderr or result.signal is not None
    assert time.monotonic() - start < FAST.wall_s


def test_busy_loop_hits_the_cpu_limit() -> None:
    # A generous wall clock, so what ends it is the CPU limit even on a busy machine.
    limits = SandboxLimits(wall_s=60, cpu_s=2, memory_mb=256)
    result = run_python("while True:\n    pass\n", limits)
    assert not result.timed_out
    assert result.signal in (signal.SIGXCPU, signal.SIGKILL)


def test_sleeping_forever_is_killed_at_the_wall_clock() -> None:
    limits = SandboxLimits(wall_s=2, cpu_s=3, memory_mb=256)
    result = run_python("import time\ntime.sleep(3600)\n", limits)
    assert result.timed_out
    assert result.duration < limits.wall_s + 2


def test_background_children_die_with_the_run(isolated: SandboxResult) -> None:
    marker = f"sparkfleet-sandbox-orphan-{os.getpid()}"
    code = (
        "import subprocess\n"
        f"subprocess.Popen(['/bin/sh', '-c', 'exec -a {marker} sleep 300'], start_new_session=True)\n"
        "print('spawned')\n"
    )
    result = run_python(code, FAST)
    assert result.stdout.strip() == "spawned"
    time.sleep(0.5)
    survivors = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert survivors == []


def test_huge_output_is_capped() -> None:
    limits = SandboxLimits(wall_s=10, cpu_s=5, memory_mb=256, output_bytes=4096)
    result = run_python("import sys\nfor _ in range(10**6):\n    sys.stdout.write('y' * 100)\n", limits)
    assert result.output_truncated
    assert len(result.stdout) <= 4096
