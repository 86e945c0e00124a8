"""The node agent, node side (stdlib only: it runs on nodes without sparkfleet). It serves every
runtime (preflight, watch, leftovers, port owners) and runs the process runtime's ranks.

Shipped as ``python3 -c <this source> COMMAND JSON``, or ``… serve``: a session answering one
JSON request per stdin line (``{"command", "payload", "stdin"}``) with one JSON line
(``{"answer"}`` or ``{"error"}``) until its stdin ends. The commands are ``start`` and
``COMMANDS``'s. A rank runs in its own process group under a monitor that records
"pgid pid starttime" in the pid file and the exit code in the exit file; ``stop`` also signals
every process whose environment marks it as the instance's, so a lost pid file still stops it.
"""

from __future__ import annotations

import json
import os
import sys
import time

# The rest is imported where it is used: every up, status and down starts this agent once per
# node, and signal, socket and subprocess would double its start-up for the calls that need none.
CLK_TCK = os.sysconf("SC_CLK_TCK")


_btime: list[float] = []  # read once: leftovers asks for every process on the node


def _boot_time() -> float:
    if not _btime:
        with open("/proc/stat") as fh:
            _btime.append(next((float(line.split()[1]) for line in fh if line.startswith("btime")), 0.0))
    return _btime[0]


def _starttime(pid: int | str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            return None
        return fields[19]
    except OSError:
        return None


def _read_pid(spec: dict) -> tuple[int, int, str] | None:
    try:
        with open(spec["pid_path"]) as fh:
            pgid, pid, start = fh.read().split()
        return int(pgid), int(pid), start
    except (OSError, ValueError):
        return None


def _env(spec: dict) -> dict[str, str]:
    env = dict(os.environ)
    with open(spec["env_file"]) as fh:
        for line in fh:
            key, _, value = line.rstrip("\n").partition("=")
            if key:
                env[key] = value
    env.update(spec.get("markers") or {})
    env["SPARKFLEET_DEPLOYMENT"] = spec["deployment"]
    env["SPARKFLEET_RANK"] = str(spec["rank"])
    env["SPARKFLEET_RANK_NODE"] = spec["node"]
    return env


def _private_dir(path: str) -> None:
    """path as a folder only this user can enter: made 0700, or checked with lstat (a symlink or
    another user's folder planted there would receive the env file)."""
    import stat

    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a folder of this user (a symlink, a file or uid {st.st_uid}'s): "
                              "refusing to start a rank there; remove it")  # fmt: skip
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def start(spec: dict, env_text: bytes) -> dict:
    import select

    _private_dir(spec["workdir"])
    # The env file arrives on stdin (or in a session's request), so secrets never sit in argv;
    # only this user may read it.
    fd = os.open(spec["env_file"] + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(env_text)
    os.replace(spec["env_file"] + ".tmp", spec["env_file"])
    for path in (spec["pid_path"], spec["exit_path"]):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    env = _env(spec)
    # The monitor writes a byte here once the pid (or exit) file is in place, and dying closes it:
    # the answer waits on the pipe, not a polling loop (non-inheritable: the engine never holds it).
    ready_r, ready_w = os.pipe()
    middle = os.fork()
    if middle != 0:
        os.close(ready_w)
        os.waitpid(middle, 0)
        if select.select([ready_r], [], [], 10)[0]:
            os.read(ready_r, 1)
        os.close(ready_r)
        return inspect(spec)
    # Forked twice: a monitor that is a session agent's child would linger as its zombie once it
    # ended (init reaps an orphan at once).
    if os.fork() != 0:
        os._exit(0)
    try:
        _monitor(spec, env, ready_r, ready_w)
    finally:
        os._exit(0)  # whatever happened, never back into the caller's code (a session's loop)


def _monitor(spec: dict, env: dict[str, str], ready_r: int, ready_w: int) -> None:
    import signal
    import subprocess

    os.close(ready_r)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    # The monitor outlives a SIGTERM to the group so it can record how the engine ended.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with os.fdopen(os.open(spec["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as log:
        os.fchmod(log.fileno(), 0o600)  # an engine's log quotes its argv and requests: this user's only
        try:
            # Popen's restore_signals gives the engine SIGPIPE and SIGXFSZ back; SIGTERM and
            # SIGHUP, ignored here, go back to default before the exec.
            proc = subprocess.Popen(spec["argv"], env=env, cwd=spec["workdir"], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    preexec_fn=_default_signals)  # fmt: skip
        except OSError as exc:
            log.write(f"sparkfleet: cannot start {spec['argv'][0]}: {exc}\n".encode())
            log.flush()  # os._exit skips the file's buffer
            _write(spec["exit_path"], "127")
            return
        _write(spec["pid_path"], f"{os.getpgrp()} {proc.pid} {_starttime(proc.pid)}")
        os.write(ready_w, b"1")
        os.close(ready_w)
        _copy_redacted(proc, log, _redactor(spec, env))
    code = proc.wait()
    _write(spec["exit_path"], str(code))


def _default_signals() -> None:
    import signal

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _redactor(spec: dict, env: dict[str, str]):  # type: ignore[no-untyped-def]
    """bytes -> bytes hiding the rank's secret values and token-shaped words (the controller
    sends which keys are secret and the patterns; the values stay in the env file)."""
    import re

    values = sorted({env[k].encode() for k in spec.get("secret_keys", []) if len(env.get(k, "")) >= 4}, key=len,
                    reverse=True)  # fmt: skip
    patterns = [re.compile(p.encode()) for p in spec.get("secret_patterns", [])]

    def redact(data: bytes) -> bytes:
        for value in values:
            data = data.replace(value, b"***")
        for pattern in patterns:
            data = pattern.sub(b"***", data)
        return data

    return redact


def _copy_redacted(proc, log, redact) -> None:  # type: ignore[no-untyped-def]
    """Copy the engine's output to its log file with secrets hidden, whole lines at a time (a
    secret never straddles two writes), until the engine exits."""
    import select

    fd = proc.stdout.fileno()
    pending = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        data = os.read(fd, 65536) if ready else b""
        if ready and not data:
            break  # every writer closed the pipe
        pending += data
        cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
        if cut == 0 and len(pending) > 1 << 16:
            cut = len(pending)  # a huge line without end: write it rather than hold it
        if cut:
            log.write(redact(pending[:cut]))
            log.flush()
            pending = pending[cut:]
        if not ready and proc.poll() is not None:
            break  # the engine is gone; its children may hold the pipe, but the rank is over
    if pending:
        log.write(redact(pending))
        log.flush()


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def inspect(spec: dict) -> dict:
    found = _read_pid(spec)
    exit_code = None
    try:
        with open(spec["exit_path"]) as fh:
            exit_code = int(fh.read().strip() or "0")
    except (OSError, ValueError):
        pass
    if found and exit_code is None and _starttime(found[1]) == found[2]:
        return {
            "state": "running",
            "pid": found[1],
            "exit_code": None,
            "started_at": _boot_time() + int(found[2]) / CLK_TCK,
        }
    state = "exited" if found or exit_code is not None else "absent"
    return {"state": state, "pid": found[1] if found else None, "exit_code": exit_code, "started_at": None}


def probe(spec: dict) -> dict:
    """inspect, plus the log's last bytes (what readiness polling needs, in one round trip)."""
    state = inspect(spec)
    try:
        with open(spec["log_path"], "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - spec.get("log_bytes", 1 << 20)))
            state["log"] = fh.read().decode(errors="replace")
    except OSError:
        state["log"] = ""
    return state


def _environ(pid: int | str) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read().split(b"\0")
    except OSError:
        return None
    out = {}
    for item in raw:
        key, sep, value = item.partition(b"=")
        if sep and key.startswith(b"SPARKFLEET_"):
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _cmdline(pid: int | str) -> str:
    """pid's command line as one line, for messages ("" when it is gone or hidden)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return ""


def _belongs(pid: str, deployment: str, rank: int | None, node: str | None, instance: str | None) -> bool:
    env = _environ(pid)
    if env is None or env.get("SPARKFLEET_DEPLOYMENT") != deployment:
        return False
    # Several simulated nodes can share one machine: each node stops only its own ranks.
    if node is not None and env.get("SPARKFLEET_RANK_NODE") != node:
        return False
    # Another controller's instance of the same name is not ours to stop.
    if instance is not None and env.get("SPARKFLEET_INSTANCE") != instance:
        return False
    return rank is None or env.get("SPARKFLEET_RANK") == str(rank)


def _members(deployment: str, rank: int | None, node: str | None, instance: str | None = None) -> list[int]:
    me = os.getpid()
    return [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit() and int(p) != me and _belongs(p, deployment, rank, node, instance)
    ]


def stop(spec: dict) -> dict:
    found = _read_pid(spec)
    groups = set()
    instance = spec.get("instance")
    # The pid file sits in a folder two controllers may share: trust it only for our instance.
    if (
        found
        and _starttime(found[1]) == found[2]
        and (instance is None or (_environ(found[1]) or {}).get("SPARKFLEET_INSTANCE") == instance)
    ):
        groups.add(found[0])
    members = _members(spec["deployment"], spec.get("rank"), spec.get("node"), instance)
    _terminate(groups | _groups_of(members), members, spec.get("grace", 10))
    # The env file holds every secret the rank was started with: gone once the rank is.
    if spec.get("env_file"):
        try:
            os.unlink(spec["env_file"])
        except OSError:
            pass
    return {"stopped": sorted(set(members) | groups)}


def _groups_of(pids: list[int]) -> set[int]:
    return {group for pid in pids if (group := _group(pid)) is not None}


def _terminate(groups: set[int], members: list[int], grace: float) -> None:
    """SIGTERM every group and member, SIGKILL what is left after grace seconds."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for kill, ids in ((os.killpg, groups), (os.kill, members)):
            for i in ids:
                try:
                    kill(i, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.time() + (grace if sig == signal.SIGTERM else 5)
        pause = 0.002  # most ranks are gone within milliseconds: look again soon, then less often
        while time.time() < deadline:
            alive = [p for p in members if _starttime(p) is not None]
            alive += [g for g in groups if _starttime(g) is not None]
            if not alive:
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def find(spec: dict) -> list[dict]:
    """Every process of the deployment on this node, with its markers (any instance)."""
    out = []
    for pid in _members(spec["deployment"], None, spec.get("node")):
        env = _environ(pid) or {}
        if _starttime(pid) is None:
            continue
        rank, started = env.get("SPARKFLEET_RANK", ""), env.get("SPARKFLEET_STARTED", "")
        out.append({"pid": pid, "rank": int(rank) if rank.isdigit() else None,
                    "instance": env.get("SPARKFLEET_INSTANCE"), "owner": env.get("SPARKFLEET_OWNER"),
                    "started": float(started) if started.isdigit() else None})  # fmt: skip
    return out


def _listeners(ports: set[int]) -> dict[str, tuple[int, int]]:
    """socket inode -> (port, uid) of every listening TCP socket on one of ports."""
    out: dict[str, tuple[int, int]] = {}
    if not ports:
        return out
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            words = line.split()
            if len(words) < 10 or words[3] != "0A":
                continue
            port = int(words[1].rsplit(":", 1)[1], 16)
            if port in ports:
                out[words[9]] = (port, int(words[7]))
    return out


def _bindable(port: int) -> bool:
    """Nothing listens on the port on any address of this node: a wildcard bind of IPv4 and IPv6
    succeeds (cheaper than reading /proc/net/tcp, a walk of the kernel's whole socket table)."""
    import socket

    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, address in families:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        try:
            # As a server binds: connections of an earlier rank still in TIME_WAIT don't count,
            # and Linux refuses the bind while anything listens on the port.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
        except OSError:
            return False  # taken (or privileged): /proc says by whom, or that nobody listens
        finally:
            sock.close()
    return True


def holders(spec: dict) -> list[dict]:
    """Who listens on each of spec's ports: pid, command line and sparkfleet markers."""
    ports = {int(p) for p in spec.get("ports", [])}
    if all(_bindable(p) for p in ports):
        return []
    sockets = _listeners(ports)
    seen = {}
    if sockets:
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            for link in _fd_links(pid):
                if link.startswith("socket:[") and link[8:-1] in sockets and link[8:-1] not in seen:
                    seen[link[8:-1]] = int(pid)
    out = []
    for inode, (port, uid) in sockets.items():
        holder = seen.get(inode)
        command, env = (_cmdline(holder), _environ(holder) or {}) if holder is not None else ("", {})
        out.append({"port": port, "uid": uid, "pid": holder, "command": command,
                    "deployment": env.get("SPARKFLEET_DEPLOYMENT") or env.get("SPARKFLEET_CONTAINER_DEPLOYMENT"),
                    "instance": env.get("SPARKFLEET_INSTANCE"), "owner": env.get("SPARKFLEET_OWNER")})  # fmt: skip
    return out


def kill(spec: dict) -> dict:
    """Stop the given pids, but only those that still belong to the deployment on this node."""
    members = [p for p in spec["pids"] if _belongs(str(p), spec["deployment"], None, spec.get("node"), None)]
    # A rank's monitor leads its group; never signal the group this agent runs in.
    _terminate(_groups_of(members) - {os.getpgrp()}, members, spec.get("grace", 10))
    return {"stopped": members}


def mem_available() -> int | None:
    """The node's MemAvailable in bytes (on a GB10 this is what CUDA can still allocate)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def watch(spec: dict) -> dict:
    """Each rank's inspect answer plus when its exit file was written, and MemAvailable."""
    import resource

    ranks = []
    for rank in spec.get("ranks", []):
        state = inspect(rank)
        try:
            state["exited_at"] = os.stat(rank["exit_path"]).st_mtime
        except OSError:
            state["exited_at"] = None
        ranks.append(state)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - _session_cpu[0]  # a session's earlier requests are not this poll's
    return {"ranks": ranks, "mem_available": mem_available(), "cpu_s": cpu}


# What makes a process sparkfleet's (SPARKFLEET_STATE_DIR and the like are a user's settings).
_MARKERS = ("SPARKFLEET_DEPLOYMENT", "SPARKFLEET_INSTANCE", "SPARKFLEET_CONTAINER_DEPLOYMENT")


def _group(pid: int | str) -> int | None:
    try:
        return os.getpgid(int(pid))
    except OSError:
        return None


def _ancestors() -> set[int]:
    """This agent and the processes it runs under (sshd, a shell, the controller itself)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _fd_links(pid: str) -> list[str]:
    """What pid's open files point at (a socket reads ``socket:[inode]``); [] where /proc hides them."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    links = []
    for fd in fds:
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile
    return links


def _holds(pid: str, workdir: str, sockets: dict[str, tuple[int, int]]) -> str | None:
    """What of the deployment a process without markers still holds, or None."""

    def under(path: str) -> bool:
        return bool(workdir) and (path == workdir or path.startswith(workdir.rstrip("/") + "/"))

    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = ""
    if under(cwd):
        return f"its working directory is {cwd}"
    for link in _fd_links(pid):
        if under(link):
            return f"it holds {link} open"
        if link.startswith("socket:[") and link[8:-1] in sockets:
            return f"it listens on port {sockets[link[8:-1]][0]}"
    return None


def leftovers(spec: dict) -> list[dict]:
    """Every process on this node still of the instance after its ranks were stopped: one that
    carries the instance's markers (a rank's child that left its process group inherits them),
    or one with no sparkfleet marker, started after the instance, that still holds its workdir
    (cwd or an open file) or listens on one of its ports. A process that dropped its markers and
    holds none of these cannot be told apart from any other of the user's."""
    deployment, node, instance = spec["deployment"], spec.get("node"), spec.get("instance")
    workdir = os.path.realpath(spec["workdir"]) if spec.get("workdir") else ""
    since = float(spec.get("since") or 0)
    # Only ports something listens on need /proc/net/tcp, whose reading walks the kernel's whole
    # socket table.
    sockets = _listeners({int(p) for p in spec.get("ports", []) if not _bindable(int(p))})
    skip = _ancestors()
    envs = {p: _environ(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in skip}
    # Process groups that hold a marked process: a rank's monitor leads its group unmarked, and
    # another instance's monitor (one sharing this workdir) is that instance's, not a leftover.
    marked_groups = _groups_of([int(p) for p, env in envs.items() if env and any(k in env for k in _MARKERS)])
    out = []
    for pid, env in envs.items():
        ticks = _starttime(pid)
        if env is None or ticks is None:
            continue  # gone meanwhile, a zombie, or another user's
        started, why = _boot_time() + int(ticks) / CLK_TCK, None
        if any(k in env for k in _MARKERS):
            if _belongs(pid, deployment, None, node, instance):
                why = "it carries the instance's markers (it left its rank's process group)"
        elif started >= since and _group(pid) not in marked_groups:
            held = _holds(pid, workdir, sockets)
            if held:
                why = f"it carries no sparkfleet markers, but {held}"
        if why is None:
            continue
        rank = env.get("SPARKFLEET_RANK", "")
        out.append({"pid": int(pid), "command": _cmdline(pid), "why": why, "started": started,
                    "rank": int(rank) if rank.isdigit() else None})  # fmt: skip
    return out


def gpu_apps(command: list[str]) -> dict:
    """nvidia-smi's compute apps (its CSV as printed), or why there is none."""
    import shutil
    import subprocess

    if not command or shutil.which(command[0]) is None:
        return {"gpu_apps": None, "gpu_error": "no nvidia-smi"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"gpu_apps": None, "gpu_error": str(exc)}
    if done.returncode != 0:
        return {"gpu_apps": None, "gpu_error": (done.stderr or done.stdout).strip()[-200:]}
    return {"gpu_apps": done.stdout, "gpu_error": None}


# What a controller may ask of this agent besides start (which also takes the env file): each
# takes the request's payload and returns its JSON answer.
COMMANDS = {
    "inspect": inspect,
    "probe": probe,
    "stop": stop,
    "find": lambda spec: {"found": find(spec)},
    "holders": lambda spec: {"holders": holders(spec)},
    "preflight": lambda spec: {"found": find(spec), "holders": holders(spec)},
    "kill": kill,
    "watch": watch,
    # what ``down`` checks once the ranks are stopped, in one round trip
    "leftovers": lambda spec: {
        "found": leftovers(spec),
        "mem_available": mem_available(),
        **gpu_apps(spec.get("gpu_command") or []),
    },
}


def answer(command: str, payload: dict, stdin: bytes) -> dict:
    if command == "start":
        return start(payload, stdin)
    if command not in COMMANDS:
        raise ValueError(f"unknown agent command {command!r}")
    return COMMANDS[command](payload)


# CPU this process had used before the current request (a session's baseline for watch's cpu_s).
_session_cpu = [0.0]


def serve() -> None:
    """Answer requests, one JSON line each way, until stdin ends (the SSH session's)."""
    import resource

    out = sys.stdout
    out.write(json.dumps({"serving": os.getpid()}) + "\n")  # the controller knows the session is up
    out.flush()
    for line in sys.stdin.buffer:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        _session_cpu[0] = usage.ru_utime + usage.ru_stime
        reply: dict[str, object]
        try:
            request = json.loads(line.decode())
            reply = {"answer": answer(request["command"], request["payload"], (request.get("stdin") or "").encode())}
        except Exception as exc:  # the session goes on; the controller raises what failed
            import traceback

            reply = {"error": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-2000:]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        # The env file of a start arrives on stdin; other commands get none (an empty read).
        stdin = sys.stdin.buffer.read() if sys.argv[1] == "start" else b""
        print(json.dumps(answer(sys.argv[1], json.loads(sys.argv[2]), stdin)))
