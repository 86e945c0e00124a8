"""Sandbox bootstrap: runs as its own interpreter (``python -I -S sandbox_boot.py CONFIG``).

It isolates itself, then execs the interpreter that runs the model's code. Only the standard
library is used, because it runs with ``-I -S`` outside the sparkfleet package's imports.

Steps, reported on the fd named in CONFIG as one JSON line so the parent can say what protected the run:
1. new mount + network + PID namespaces: as root directly, otherwise inside a new user
   namespace (uid mapped to 0); if neither is allowed, none (the report says so);
2. every mount remounted read-only in the private mount namespace, then a size-limited tmpfs
   over the work directory — the only writable place; without namespaces, or with a mount
   left writable, the code is not run (exit 126) unless CONFIG says ``unconfined_ok``;
3. a forked child becomes PID 1 of the new PID namespace, dies with this process (so a model
   process that escapes the process group still dies), sets resource limits, gives up
   privileges (as root: becomes ``nobody``; always: an empty capability bounding set and
   no-new-privileges, so it cannot remount anything writable again) and execs the code.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from typing import Any, TextIO

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
NOBODY = 65534
REFUSED = 126  # the code was not run: no isolation, and unconfined runs were not allowed
_OUTSIDE_UID = os.getuid()
_KEEP_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> str | None:
    rc = libc.mount(
        src.encode() if src else None,
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    return None if rc == 0 else os.strerror(ctypes.get_errno())


def _unescape(path: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    return path.encode().decode("unicode_escape").encode("latin-1").decode(errors="replace")


def _enter_namespaces() -> str:
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
    if libc.unshare(flags) == 0:
        return "root"
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(flags | CLONE_NEWUSER) == 0:
        with open("/proc/self/setgroups", "w") as fh:
            fh.write("deny")
        with open("/proc/self/uid_map", "w") as fh:
            fh.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as fh:
            fh.write(f"0 {gid} 1")
        return "userns"
    return "none"


def _read_only_everything(work: str, tmpfs_mb: int) -> list[str]:
    failed: list[str] = []
    err = _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    if err:
        return [f"/ (make private: {err})"]
    with open("/proc/self/mountinfo") as fh:
        rows = [line.split() for line in fh]
    for row in rows:
        target = _unescape(row[4])
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in row[5].split(","):
            flags |= _KEEP_FLAGS.get(opt, 0)
        err = _mount(None, target, None, flags, None)
        if err:
            failed.append(f"{target} ({err})")
    err = _mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_mb}m,mode=0777")
    if err:
        failed.append(f"{work} (tmpfs: {err})")
    return failed


def _limit(cfg: dict[str, Any]) -> None:
    mem = cfg["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_bytes"], cfg["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop_privileges(mode: str) -> str:
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # Without capabilities in the bounding set, an exec'd uid 0 gets none, so it cannot remount.
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    if mode == "root" or (mode == "none" and os.getuid() == 0):
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        return "nobody"
    if mode == "userns":
        return f"{_OUTSIDE_UID} (uid 0 only inside its user namespace)"
    return str(os.getuid())


def main() -> None:
    cfg = json.loads(sys.argv[1])
    report = os.fdopen(cfg["report_fd"], "w")
    work = cfg["work"]
    mode = _enter_namespaces()
    failed = _read_only_everything(work, cfg["tmpfs_mb"]) if mode != "none" else []
    if (mode == "none" or failed) and not cfg.get("unconfined_ok"):
        # Without its isolation the model's code could write the user's files and reach the
        # network: it is not run at all unless the user asked for that in so many words.
        report.write(json.dumps({"namespaces": mode, "remount_failed": failed, "user": None, "refused": True}) + "\n")
        report.close()
        sys.exit(REFUSED)
    # Lo stays down in the new network namespace: no route anywhere, loopback included.
    pid = os.fork()
    if pid == 0:
        # PID 1 of the new namespace: its death kills everything inside. The model's code runs
        # one level below, because the kernel ignores default-action signals (SIGXCPU) for PID 1.
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        child = os.fork()
        if child == 0:
            _run_code(cfg, mode, failed, report)
        report.close()
        os._exit(_wait_status(child))
    report.close()
    sys.exit(_wait_status(pid))


def _run_code(cfg: dict[str, Any], mode: str, failed: list[str], report: TextIO) -> None:
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    work = cfg["work"]
    os.chdir(work)
    _limit(cfg)
    user = _drop_privileges(mode)
    report.write(json.dumps({"namespaces": mode, "remount_failed": failed, "user": user}) + "\n")
    report.close()
    env = {"HOME": work, "TMPDIR": work, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    os.execve(cfg["python"], [cfg["python"], "-I", "-S", "-c", cfg["code"]], env)


def _wait_status(pid: int) -> int:
    """Exit code of pid; a death by signal N becomes 128 + N, as a shell reports it."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    main()
