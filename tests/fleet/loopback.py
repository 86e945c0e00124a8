"""Loopback fleet: N real ``sshd`` processes on 127.0.S.(10+i), one per simulated node.

Pure standard library. Needs ``/usr/sbin/sshd`` and ``ssh-keygen``/``ssh`` (Debian packages
openssh-server / openssh-client; ``scripts/setup-system.sh`` installs them).

Usage::

    from tests.fleet import loopback_fleet

    with loopback_fleet(4, tmp_path) as fleet:
        fleet.cluster_file          # Path: sparkfleet cluster.toml for these nodes
        fleet.ssh_config            # Path: ssh_config with Host node0..node3 (use ``ssh -F``)
        fleet.nodes[2].host         # "127.0.0.12"
        fleet.run(2, "hostname")    # CompletedProcess of ``ssh -F ssh_config node2 hostname``
        fleet.fan_out("true")       # run on every node in parallel -> list[CompletedProcess]
        fleet.stop_node(1)          # node1 goes away: its sshd and every session it serves die
        fleet.start_node(1)         # ... and comes back with the same host key
        fleet.freeze_node(3)        # SIGSTOP its sshd: new connections hang (timeouts)
        fleet.thaw_node(3)

Each node has its own sshd_config, host key, PidFile, log (``node<i>/sshd.log``) and state
dir; all nodes authorise one shared client key for the current user (root on the test
machines). ``known_hosts`` lists every node's host key, so ``StrictHostKeyChecking yes``
works. The ssh_config multiplexes (ControlMaster auto, ControlPersist 60); ``close()`` ends
the masters, kills every sshd and removes nothing of ``workdir`` (pytest's tmp_path cleans).

Addresses: node i listens on 127.0.S.(10+i):port. 127.0.0.0/8 is all loopback on Linux, so
no interface set-up is needed. ``port`` defaults to 22 when run as root (the bind address
differs from a system sshd's, unless that one listens on 0.0.0.0:22) else 2222; the first
subnet S (from 0) whose addresses are all free at that port is used, so several fleets (e.g.
pytest-xdist workers) can run side by side.

Every node shares this machine's filesystem, processes and Docker daemon: "node" isolation
is only the SSH endpoint, the per-node state_dir/hf_cache paths in cluster.toml, and the env
``SPARKFLEET_NODE=<name>`` that each sshd sets for its sessions.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SFTP_SERVER = next(
    (
        p
        for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/libexec/sftp-server")
        if os.path.exists(p)
    ),
    "internal-sftp",
)


@dataclass
class Node:
    index: int
    name: str
    host: str
    port: int
    dir: Path
    state_dir: Path
    hf_cache: Path
    host_key: Path
    sshd_config: Path
    pid_file: Path
    log_file: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _free(addr: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as sshd does: ignore TIME_WAIT
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


def descendants(pid: int) -> list[int]:
    """All descendants of ``pid`` (from /proc), deepest last."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


# Every login to a node carries this (sshd's SetEnv), so what a node's logins started, daemons
# included, can be told apart from other fleets' on this one machine.
NODE_MARK = "SPARKFLEET_TEST_NODE_DIR"


def pids_with_env(entry: str, comm: str | None = None) -> list[int]:
    """Pids on this machine whose environment holds ``entry`` ("NAME=value"), of those named
    ``comm`` when given."""
    mark = entry.encode()
    out = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if comm is not None and Path(f"/proc/{pid}/comm").read_text().strip() != comm:
                continue
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                out.append(int(pid))
        except OSError:
            continue
    return out


def started_on(node: Node) -> list[int]:
    """Every process a login to the node started that still runs (its sshd's own excluded)."""
    return pids_with_env(f"{NODE_MARK}={node.dir}")


def _release_killed_rehash_lock() -> None:
    """A root login on this test machine runs ``pyenv rehash`` from ~/.bashrc, which holds
    ~/.pyenv/shims/.pyenv-shim as its lock and removes it in an EXIT trap. A session killed
    with SIGKILL in that step (a node going away) leaves the lock, and every later root login
    waits 60 s for it. Removed here when no rehash is running any more."""
    lock = Path.home() / ".pyenv" / "shims" / ".pyenv-shim"
    if not lock.exists():
        return
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            if b"rehash" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return
    with contextlib.suppress(FileNotFoundError):
        lock.unlink()


def sessions_cpu(fleet: LoopbackFleet) -> float:
    """CPU seconds (user + system) spent so far under the fleet's sshds: their SSH sessions and
    every command those ran and waited for (a daemon that left its session, such as a rank's
    monitor and engine, is not counted)."""
    ticks = 0
    for node in fleet.nodes:
        if node.proc is None:
            continue
        for pid in (node.proc.pid, *descendants(node.proc.pid)):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _memlock_setting() -> str:
    """Docker-compatible memlock for this host: "unlimited" or the hard limit in bytes."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return "unlimited" if hard == resource.RLIM_INFINITY else str(hard)


def client_options(client_key: Path, known_hosts: Path, cm_dir: Path, persist: int) -> str:
    """The ssh_config lines every fleet's Host entry shares: the one client key, strict host
    keys from the fleet's known_hosts, no prompts, and a multiplexed master."""
    return (
        f"  IdentityFile {client_key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 5\n"
        "  ServerAliveInterval 5\n  ServerAliveCountMax 2\n  LogLevel ERROR\n"
        f"  ControlMaster auto\n  ControlPath {cm_dir}/%C\n  ControlPersist {persist}\n\n"
    )


def _toml_str(s: object) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


class LoopbackFleet:
    """N loopback sshd nodes; see the module docstring."""

    def __init__(
        self,
        n: int,
        workdir: str | os.PathLike,
        *,
        port: int | None = None,
        user: str | None = None,
        name: str = "loopback",
        shared_hf_cache: str | os.PathLike | None = None,
        gpus: str = "none",
        memlock: str | None = None,
        first_octet: int = 10,
        start: bool = True,
    ) -> None:
        if not 1 <= n <= 200:
            raise ValueError("n must be 1..200")
        self.n, self.name = n, name
        self.user = user or getpass.getuser()
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port if port is not None else (22 if os.geteuid() == 0 else 2222)
        self.gpus = gpus
        self.memlock = memlock or _memlock_setting()
        # ControlPath must stay short (108-byte socket path limit): own dir under /tmp.
        self._cm_dir = Path(tempfile.mkdtemp(prefix="sfcm"))
        self.subnet = self._pick_subnet(first_octet)
        self.client_key = self.workdir / "client_key"
        self.authorized_keys = self.workdir / "authorized_keys"
        self.known_hosts = self.workdir / "known_hosts"
        self.ssh_config = self.workdir / "ssh_config"
        self.cluster_file = self.workdir / "cluster.toml"
        self.nodes: list[Node] = []
        self._shared_hf = Path(shared_hf_cache) if shared_hf_cache else None
        self._setup(first_octet)
        if start:
            try:
                self.start_all()
            except BaseException:
                self.close()
                raise

    # -- set-up ------------------------------------------------------------------------
    def _pick_subnet(self, first: int) -> str:
        for s in range(0, 250):
            sub = f"127.0.{s}"
            if all(_free(f"{sub}.{first + i}", self.port) for i in range(self.n)):
                return sub
        raise RuntimeError(f"no free 127.0.S.x subnet for {self.n} nodes at port {self.port}")

    def _keygen(self, path: Path, comment: str) -> None:
        if not path.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)

    def _setup(self, first: int) -> None:
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd privilege separation
        self._keygen(self.client_key, "sparkfleet-loopback-client")
        self.authorized_keys.write_text(Path(f"{self.client_key}.pub").read_text())
        self.authorized_keys.chmod(0o600)
        kh, cfg = (
            [],
            [
                "# written by tests/fleet/loopback.py\n",
            ],
        )
        for i in range(self.n):
            name, host = f"node{i}", f"{self.subnet}.{first + i}"
            d = self.workdir / name
            d.mkdir(exist_ok=True)
            node = Node(
                index=i,
                name=name,
                host=host,
                port=self.port,
                dir=d,
                state_dir=d / "state",
                hf_cache=self._shared_hf or d / "hf",
                host_key=d / "ssh_host_ed25519_key",
                sshd_config=d / "sshd_config",
                pid_file=d / "sshd.pid",
                log_file=d / "sshd.log",
            )
            node.state_dir.mkdir(exist_ok=True)
            node.hf_cache.mkdir(parents=True, exist_ok=True)
            self._keygen(node.host_key, f"sparkfleet-{name}")
            node.sshd_config.write_text(
                f"Port {self.port}\n"
                f"ListenAddress {host}\n"
                f"HostKey {node.host_key}\n"
                f"PidFile {node.pid_file}\n"
                f"AuthorizedKeysFile {self.authorized_keys}\n"
                "StrictModes no\nUsePAM no\nPubkeyAuthentication yes\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                "PermitRootLogin prohibit-password\nUseDNS no\nPrintMotd no\nPrintLastLog no\n"
                "MaxStartups 200\nMaxSessions 200\nLogLevel VERBOSE\n"
                "AllowTcpForwarding yes\nAcceptEnv LANG LC_* SPARKFLEET_*\n"
                f"SetEnv SPARKFLEET_NODE={name} {NODE_MARK}={d}\n"
                f"Subsystem sftp {SFTP_SERVER}\n"
            )
            pub = Path(f"{node.host_key}.pub").read_text().split()
            addr = host if self.port == 22 else f"[{host}]:{self.port}"
            alias = name if self.port == 22 else f"[{name}]:{self.port}"
            kh.append(f"{addr},{alias} {pub[0]} {pub[1]}\n")
            cfg.append(
                f"Host {name} {host}\n"
                f"  HostName {host}\n  Port {self.port}\n  User {self.user}\n"
                + client_options(self.client_key, self.known_hosts, self._cm_dir, 60)
            )
            self.nodes.append(node)
        self.known_hosts.write_text("".join(kh))
        self.ssh_config.write_text("".join(cfg))
        self.ssh_config.chmod(0o600)
        self.write_cluster_file()

    def write_cluster_file(self, path: str | os.PathLike | None = None) -> Path:
        """(Re)write a sparkfleet cluster.toml (DESIGN.md "Cluster inventory")."""
        path = Path(path) if path else self.cluster_file
        lines = [
            f"# loopback fleet of {self.n} sshd nodes (tests/fleet); ssh_config: {self.ssh_config}",
            f"name = {_toml_str(self.name)}",
            "",
            "[defaults]",
            f"user = {_toml_str(self.user)}",
            f"ssh_port = {self.port}",
            f"ssh_key = {_toml_str(self.client_key)}",
            f"ssh_config = {_toml_str(self.ssh_config)}",
            f"hf_cache = {_toml_str(self.nodes[0].hf_cache if self._shared_hf else self.workdir / 'hf')}",
            f"state_dir = {_toml_str(self.workdir / 'state')}",
            f"gpus = {_toml_str(self.gpus)}",
            f"memlock = {_toml_str(self.memlock)}",
            "rdma = false",
            "# the nodes share this machine: each rank's servers listen on its node's own address",
            'bind_address = "fabric"',
            "",
        ]
        for node in self.nodes:
            lines += [
                "[[nodes]]",
                f"name = {_toml_str(node.name)}",
                f"host = {_toml_str(node.host)}",
                f"fabric_ip = {_toml_str(node.host)}",
                f"state_dir = {_toml_str(node.state_dir)}",
                f"hf_cache = {_toml_str(node.hf_cache)}",
                "",
            ]
        path.write_text("\n".join(lines))
        return path

    # -- node lifecycle ----------------------------------------------------------------
    def start_node(self, i: int, timeout: float = 10.0) -> Node:
        node = self.nodes[i]
        if node.running:
            return node
        with open(node.log_file, "ab") as log:  # sshd keeps its own copy of the descriptor
            node.proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(node.sshd_config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                raise RuntimeError(
                    f"sshd for {node.name} exited {node.proc.returncode}: " + node.log_file.read_text()[-2000:]
                )
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex((node.host, node.port)) == 0:
                    return node
            time.sleep(0.05)
        raise RuntimeError(
            f"sshd for {node.name} not listening on {node.host}:{node.port} "
            f"after {timeout}s: " + node.log_file.read_text()[-2000:]
        )

    def start_all(self) -> None:
        for i in range(self.n):
            self.start_node(i)

    def stop_node(self, i: int) -> None:
        """The node goes away: kill its sshd and every session process it spawned, and drop the
        client's multiplexed master so the next ssh really reconnects."""
        node = self.nodes[i]
        self._exit_master(node)
        if node.proc is None:
            return
        pids = [node.proc.pid, *descendants(node.proc.pid)]
        for p in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
                os.kill(p, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(timeout=5)
        node.proc = None
        _release_killed_rehash_lock()
        with contextlib.suppress(FileNotFoundError):
            node.pid_file.unlink()

    def freeze_node(self, i: int) -> None:
        """SIGSTOP the node's sshd listener: new connections hang until thaw_node()."""
        self._exit_master(self.nodes[i])
        if self.nodes[i].proc:
            os.kill(self.nodes[i].proc.pid, signal.SIGSTOP)

    def thaw_node(self, i: int) -> None:
        if self.nodes[i].proc:
            os.kill(self.nodes[i].proc.pid, signal.SIGCONT)

    def _exit_master(self, node: Node) -> None:
        subprocess.run(
            ["ssh", "-F", str(self.ssh_config), "-O", "exit", node.name],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
        )

    def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                self.stop_node(node.index)
        shutil.rmtree(self._cm_dir, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------------
    def ssh_argv(self, i: int, command: str | Sequence[str] = ()) -> list[str]:
        cmd = [command] if isinstance(command, str) else list(command)
        return ["ssh", "-F", str(self.ssh_config), self.nodes[i].name, *cmd]

    def run(
        self, i: int, command: str, *, timeout: float = 60, check: bool = False, input: str | None = None
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.ssh_argv(i, command),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def fan_out(self, command: str, *, timeout: float = 60) -> list[subprocess.CompletedProcess]:
        with ThreadPoolExecutor(max_workers=self.n) as ex:
            return list(ex.map(lambda i: self.run(i, command, timeout=timeout), range(self.n)))

    def __enter__(self) -> LoopbackFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def loopback_fleet(n: int, workdir: str | os.PathLike, **kw) -> Iterator[LoopbackFleet]:
    """Start an n-node loopback fleet under ``workdir``; stop everything on exit."""
    fleet = LoopbackFleet(n, workdir, **kw)
    try:
        yield fleet
    finally:
        fleet.close()
