"""Run a command where no namespace can be created: ``python tests/no_namespaces.py ARGV...``.

What a CI runner or Docker's default seccomp gives sparkfleet, made for real without touching
the machine: a user namespace of this test's own (uids and gids 0-65535 mapped onto the same
ones outside, so files and ``nobody`` mean what they mean outside) in which
``user.max_user_namespaces`` is 0 (no user namespace below it) and the command runs without
CAP_SYS_ADMIN (no mount, network or PID namespace). Needs root outside (to write the maps).
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWUSER = 0x10000000
PR_CAPBSET_DROP = 24
CAP_SYS_ADMIN = 21


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        if libc.unshare(CLONE_NEWUSER) != 0:
            os._exit(111)
        os.write(ready_w, b"x")
        if os.read(go_r, 1) != b"x":  # the maps are written
            os._exit(112)
        with open("/proc/sys/user/max_user_namespaces", "w") as fh:
            fh.write("0")
        # The bounding set is what an exec'd uid 0 keeps: no CAP_SYS_ADMIN, so no namespace.
        if libc.prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) != 0:
            os._exit(113)
        os.execvp(argv[0], argv)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) != b"x":
        os.waitpid(pid, 0)
        print("no_namespaces: cannot create the test's user namespace", file=sys.stderr)
        return 111
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as fh:
            fh.write("0 0 65536")
    os.write(go_w, b"x")
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
