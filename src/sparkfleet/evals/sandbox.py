"""Run model-written Python where it cannot touch the user's files or the network.

What protects a run (reported in ``SandboxResult.isolation``, never assumed):
- a separate interpreter in isolated mode (``-I -S``: no site-packages, no user paths, no
  PYTHON* variables), a clean environment with HOME and TMPDIR in the work directory;
- private mount, network and PID namespaces (as root directly; as a normal user through a user
  namespace). Every mount is read-only there; the work directory is a fresh size-limited tmpfs,
  the only writable place, gone when the run ends. The network namespace has no interfaces up,
  so nothing — loopback included — can be reached. The PID namespace dies with the run;
- resource limits: CPU seconds, address space, file size (which also caps captured output, as
  stdout and stderr are files), process count, no core dumps;
- no privileges: as root the code runs as ``nobody``; always with an empty capability bounding
  set and no-new-privileges, so it cannot remount anything writable;
- a wall-clock timeout that kills the whole process group (and with it the PID namespace).
Where the OS refuses namespaces (Docker's default seccomp, many CI runners,
``user.max_user_namespaces=0``) the code is not run at all (``ran`` is False) unless the limits
say ``unconfined_ok`` (``eval quality --unsafe-unconfined-code``); then ``isolation`` says plainly
that the network and the filesystem are not isolated.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkfleet.errors import EvalError

_BOOT = Path(__file__).with_name("sandbox_boot.py")
_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
# The code travels in argv (one word is capped at 128 KiB by the kernel).
MAX_CODE_BYTES = 100_000


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one run."""

    wall_s: float = 20.0
    cpu_s: int = 10
    memory_mb: int = 768
    output_bytes: int = 64 * 1024
    file_bytes: int = 4 * 1024 * 1024
    tmpfs_mb: int = 32
    nproc: int = 64
    unconfined_ok: bool = False  # run even where no isolation can be had (the user said so)


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    duration: float
    isolation: str
    isolated: bool
    ran: bool = True  # False: refused before the code started (no isolation to be had)

    @property
    def signal(self) -> int | None:
        """The signal that ended the code, if one did (exit status 128 + N)."""
        return self.exit_code - 128 if self.exit_code > 128 else None


def _world_executable(path: str) -> bool:
    """True when a user other than the owner can reach and run ``path``."""
    p = Path(path).resolve()
    if not p.is_file() or not os.stat(p).st_mode & stat.S_IXOTH:
        return False
    return all(os.stat(parent).st_mode & stat.S_IXOTH for parent in p.parents)


def sandbox_python() -> str:
    """The interpreter for model code: ours when ``nobody`` can run it, else the system one."""
    if os.getuid() != 0 or _world_executable(sys.executable):
        return sys.executable
    for cand in _SYSTEM_PYTHONS:
        if _world_executable(cand):
            return cand
    raise EvalError(
        "no Python interpreter that the unprivileged sandbox user can run "
        f"({sys.executable} is not reachable by 'nobody'; install python3 in /usr/bin)"
    )


def _describe(report: dict[str, Any] | None) -> tuple[str, bool]:
    if report is None:
        return "sandbox did not start (no isolation report)", False
    mode = report.get("namespaces")
    failed = report.get("remount_failed") or []
    user = report.get("user")
    if report.get("refused"):
        why = "this OS refused new namespaces" if mode == "none" else "NOT read-only: " + ", ".join(map(str, failed))
        return f"NOT RUN: no isolation ({why}); model code runs only isolated", False
    if mode == "none":
        return (
            "NOT ISOLATED: this OS refused new namespaces, so the code could reach the network and "
            f"write wherever user {user} may; only the temp cwd, HOME and resource limits applied",
            False,
        )
    text = (
        f"{mode} namespaces (mount, net, pid); filesystem read-only except a fresh tmpfs cwd; "
        f"no network; user {user}; no capabilities"
    )
    if failed:
        return text + "; NOT read-only: " + ", ".join(str(f) for f in failed), False
    return text, True


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    with path.open("rb") as fh:
        data = fh.read(cap + 1)
    return data[:cap].decode(errors="replace"), len(data) > cap


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` in the sandbox and return what it did; never raises for the code's faults."""
    limits = limits or SandboxLimits()
    if len(code.encode()) > MAX_CODE_BYTES:
        return SandboxResult(1, "", f"code too large (> {MAX_CODE_BYTES} bytes)", False, False, 0.0, "", False)
    base = Path(tempfile.mkdtemp(prefix="sparkfleet-sandbox-"))
    try:
        work = base / "work"
        work.mkdir()
        # Only matters when no namespace could be made: then the code runs in this directory.
        work.chmod(0o777)
        out_path, err_path = base / "stdout", base / "stderr"
        cfg = {
            "work": str(work),
            "python": sandbox_python(),
            "code": code,
            "cpu_s": limits.cpu_s,
            "memory_mb": limits.memory_mb,
            "file_bytes": limits.file_bytes,
            "tmpfs_mb": limits.tmpfs_mb,
            "nproc": limits.nproc,
            "unconfined_ok": limits.unconfined_ok,
        }
        report_r, report_w = os.pipe()
        cfg["report_fd"] = report_w
        start = time.monotonic()
        timed_out = False
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_BOOT), json.dumps(cfg)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(report_w,),
                start_new_session=True,
                cwd=str(work),
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
            os.close(report_w)
            try:
                proc.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        duration = time.monotonic() - start
        with os.fdopen(report_r) as fh:
            line = fh.readline()
        report = json.loads(line) if line.strip() else None
        isolation, isolated = _describe(report)
        stdout, trunc_out = _read_capped(out_path, limits.output_bytes)
        stderr, trunc_err = _read_capped(err_path, limits.output_bytes)
        code_rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return SandboxResult(
            exit_code=code_rc,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            output_truncated=trunc_out or trunc_err,
            duration=duration,
            isolation=isolation,
            isolated=isolated,
            ran=not (report or {}).get("refused"),
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
