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
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkfleet.evals.sandbox import SandboxLimits, SandboxResult, run_python

# The limit tests hold without namespaces too; containment tests skip (below) where there are none.
FAST = SandboxLimits(wall_s=8, cpu_s=3, memory_mb=256, unconfined_ok=True)


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


NO_NAMESPACES = Path(__file__).resolve().parents[1] / "no_namespaces.py"


@contextlib.contextmanager
def _hostile_model(mark: Path) -> Iterator[str]:
    """An OpenAI-style server whose answer to every code task defines the function asked for,
    which, when called, writes mark (outside its folder) and reads a host file."""
    import json

    from sparkfleet.evals.tasks import load_tasks
    from tests.json_http import JsonHandler, serving

    entries = {t.prompt: t.check["entry"] for t in load_tasks(categories=["code"])}

    class Handler(JsonHandler):
        def do_GET(self) -> None:
            self._send({"data": [{"id": "hostile", "owned_by": "vllm"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            entry = entries.get(body["messages"][0]["content"], "f")
            code = (f"def {entry}(*args, **kwargs):\n    open({str(mark)!r}, 'a').write(open('/etc/hostname').read())\n"
                    "    return None\n")  # fmt: skip
            message = {"content": f"```python\n{code}```"}
            self._send({"choices": [{"message": message, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1}})  # fmt: skip

    with serving(Handler) as url:
        yield url


def _quality_without_namespaces(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(NO_NAMESPACES), sys.executable, "-m", "sparkfleet.cli.main",
            "eval", "quality", url, "--categories", "code", "--timeout", "30", *extra]  # fmt: skip
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)


def test_without_namespaces_eval_quality_runs_no_model_code_and_exits_2(tmp_path: Path, sticky_tmp: Path) -> None:
    """Namespaces refused for real (tests/no_namespaces.py: user.max_user_namespaces=0 in the
    test's own user namespace, no CAP_SYS_ADMIN): the code tasks are refused, none runs."""
    if os.getuid() != 0:
        pytest.skip("tests/no_namespaces.py writes uid maps: needs root")
    mark = sticky_tmp / "escaped"
    with _hostile_model(mark) as url:
        out = _quality_without_namespaces(url, tmp_path)
        assert out.returncode == 2, out.stdout + out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "nothing was run" in out.stderr and "--unsafe-unconfined-code" in out.stderr
        assert not mark.exists()  # no model code ran
        # Asked for in so many words, it runs, and the run says it was not isolated.
        unsafe = _quality_without_namespaces(url, tmp_path, "--unsafe-unconfined-code")
    assert unsafe.returncode == 0, unsafe.stderr
    assert "NOT ISOLATED" in unsafe.stdout
    assert mark.exists()
