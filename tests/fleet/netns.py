"""Namespace fleet: N nodes with real, separate networks, each a Linux network namespace.

Beside the loopback fleet (tests/fleet/loopback.py, where every node is this machine's network),
each node here has its own interfaces, addresses, routes and MTUs, laid out like a DGX Spark:

- `enP7s7` on the management network 10.0.0.0/24 (MTU 1500), and the fabric NIC
  `enp1s0f0np0` on 192.168.200.0/24 (MTU 9000) — on the node given as `odd`, the other
  ConnectX port, `enp1s0f1np1`, as a user whose cable sits in the other port has it;
- two bridges in a switch namespace of their own, joined to each node by veth pairs: the
  management switch and the fabric switch (this machine's own network is never touched);
- a real sshd per node, run inside the node's namespace by ssh's ProxyCommand
  (`ip netns exec NS sshd -i`): no listener on this machine, so nothing collides with it;
- a sysfs tree per node laid out like a ConnectX-7's RoCE devices (tests/fleet/connectx.py:
  RDMA cannot exist on this kernel), found by the rdma probe through the session's
  `SPARKFLEET_SYSFS_ROOT` / `SPARKFLEET_DEV_ROOT`: rocep1s0f0 / roceP2p1s0f0 (twins) and
  rocep1s0f1 / roceP2p1s0f1, the pair on the node's fabric port ACTIVE, the RoCE v2 GID of the
  fabric address at index 3;
- perftest's `ib_write_bw` / `ib_write_lat` on each node's PATH (`<node dir>/bin`, first on the
  PATH its sshd sets): the stand-in of tests/fleet/perftest_standin.py, which pairs, listens and
  connects for real and replays captured real output (`perftest_scale` slows one node's HCA).

A wrong interface name, a missing route, an MTU mismatch and an unreachable pair are real faults
here (`set_mtu`, `block`, `drop_route`, `remove_hca`). Needs root, `ip` (iproute2) and sshd.
Names carry the pid (`sft<pid>n<i>`, `sft<pid>sw`), and `close()` kills every process left in
the namespaces and deletes them, also after a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.fleet.connectx import write_dev, write_port
from tests.fleet.loopback import client_options

PERFTEST_STANDIN = Path(__file__).with_name("perftest_standin.py")

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
IP = shutil.which("ip") or "/usr/sbin/ip"
SFTP_SERVER = next(
    (p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server") if os.path.exists(p)),
    "internal-sftp",
)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FABRIC_NET = "192.168.200"
MGMT_NET = "10.0.0"
MGMT_IF = "enP7s7"
PORTS = {"enp1s0f0np0": ("rocep1s0f0", "roceP2p1s0f0"), "enp1s0f1np1": ("rocep1s0f1", "roceP2p1s0f1")}


def usable() -> str | None:
    """Why this machine cannot run the fleet, or None when it can (tried, not guessed)."""
    if os.geteuid() != 0:
        return "needs root (ip netns add)"
    if not os.path.exists(SSHD):
        return "openssh-server missing"
    name = f"sft{os.getpid()}probe"
    made = subprocess.run([IP, "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run([IP, "netns", "del", name], capture_output=True)
    return None


@dataclass
class NsNode:
    index: int
    name: str
    netns: str
    fabric_if: str
    fabric_ip: str
    mgmt_ip: str
    dir: Path
    sys_root: Path
    dev_root: Path

    @property
    def hcas(self) -> tuple[str, str]:
        return PORTS[self.fabric_if]


def _run(*argv: str) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")


class NetnsFleet:
    """N namespace nodes; see the module docstring."""

    def __init__(self, n: int, workdir: str | os.PathLike[str], *, odd: int | None = 1, name: str = "netns") -> None:
        if not 2 <= n <= 50:
            raise ValueError("n must be 2..50")
        self.n, self.name = n, name
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tag = f"sft{os.getpid()}"
        self.switch = f"{self.tag}sw"
        self._cm_dir = Path(tempfile.mkdtemp(prefix="sfnc"))
        self.client_key = self.workdir / "client_key"
        self.known_hosts = self.workdir / "known_hosts"
        self.ssh_config = self.workdir / "ssh_config"
        self.cluster_file = self.workdir / "cluster.toml"
        self.nodes: list[NsNode] = []
        self._made: list[str] = []
        try:
            self._setup(odd)
        except BaseException:
            self.close()
            raise

    # -- set-up ------------------------------------------------------------------------
    def _netns(self, name: str) -> None:
        _run(IP, "netns", "add", name)
        self._made.append(name)
        _run(IP, "-n", name, "link", "set", "lo", "up")

    def _setup(self, odd: int | None) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd privilege separation
        if not self.client_key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.client_key)], check=True)
        self._netns(self.switch)
        for bridge, mtu in (("brm", 1500), ("brf", 9000)):
            _run(IP, "-n", self.switch, "link", "add", bridge, "type", "bridge")
            _run(IP, "-n", self.switch, "link", "set", bridge, "mtu", str(mtu), "up")
        known, cfg = [], ["# written by tests/fleet/netns.py\n"]
        for i in range(self.n):
            fabric_if = "enp1s0f1np1" if i == odd else "enp1s0f0np0"
            d = self.workdir / f"node{i}"
            node = NsNode(i, f"node{i}", f"{self.tag}n{i}", fabric_if, f"{FABRIC_NET}.{11 + i}",
                          f"{MGMT_NET}.{11 + i}", d, d / "sys", d / "dev")  # fmt: skip
            d.mkdir(exist_ok=True)
            self._netns(node.netns)
            self._link(node, MGMT_IF, f"m{i}", "brm", node.mgmt_ip, 1500)
            self._link(node, fabric_if, f"f{i}", "brf", node.fabric_ip, 9000)
            self.write_rdma(node)
            self.write_perftest(node)
            known.append(self._sshd(node))
            cfg.append(
                f"Host {node.name}\n  HostKeyAlias {node.name}\n  User root\n"
                f"  ProxyCommand {IP} netns exec {node.netns} {SSHD} -i -f {d / 'sshd_config'} -E {d / 'sshd.log'}\n"
                + client_options(self.client_key, self.known_hosts, self._cm_dir, 30)
            )
            self.nodes.append(node)
        self.known_hosts.write_text("".join(known))
        self.ssh_config.write_text("".join(cfg))
        self.ssh_config.chmod(0o600)
        self.write_cluster_file()

    def _link(self, node: NsNode, ifname: str, peer: str, bridge: str, address: str, mtu: int) -> None:
        _run(IP, "link", "add", "name", ifname, "netns", node.netns, "type", "veth", "peer", "name", peer,
             "netns", self.switch)  # fmt: skip
        _run(IP, "-n", self.switch, "link", "set", peer, "master", bridge, "mtu", str(mtu), "up")
        _run(IP, "-n", node.netns, "link", "set", ifname, "mtu", str(mtu), "up")
        _run(IP, "-n", node.netns, "addr", "add", f"{address}/24", "dev", ifname)

    def _sshd(self, node: NsNode) -> str:
        key = node.dir / "ssh_host_ed25519_key"
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (node.dir / "sshd_config").write_text(
            f"HostKey {key}\nAuthorizedKeysFile {self.client_key}.pub\n"
            "StrictModes no\nUsePAM no\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nUseDNS no\n"
            "PrintMotd no\nPrintLastLog no\nMaxSessions 200\nLogLevel VERBOSE\n"
            "AcceptEnv LANG LC_* SPARKFLEET_*\n"
            f"SetEnv SPARKFLEET_NODE={node.name} SPARKFLEET_SYSFS_ROOT={node.sys_root} "
            f"SPARKFLEET_DEV_ROOT={node.dev_root} PATH={node.dir / 'bin'}:{DEFAULT_PATH}\n"
            f"Subsystem sftp {SFTP_SERVER}\n"
        )
        kind, blob = Path(f"{key}.pub").read_text().split()[:2]
        return f"{node.name} {kind} {blob}\n"

    def write_rdma(self, node: NsNode, active: bool = True) -> None:
        """(Re)write the node's ConnectX tree: the twin pair on its fabric port ACTIVE (DOWN with
        active=False, as with no cable), the fabric address's GIDs on the first twin (only one
        twin needs an address)."""
        shutil.rmtree(node.sys_root, ignore_errors=True)
        shutil.rmtree(node.dev_root, ignore_errors=True)
        for netdev, (hca, twin) in PORTS.items():
            up = netdev == node.fabric_if
            state = "4: ACTIVE" if up and active else "1: DOWN"
            mac = f"0c:42:a1:{node.index:02x}:{list(PORTS).index(netdev):02x}:01"
            write_port(node.sys_root, hca, netdev, (node.fabric_ip,) if up else (), state=state, mac=mac)
            write_port(node.sys_root, twin, netdev.replace("enp1", "enP2p1"), state=state, mac=mac[:-2] + "02")
        write_dev(node.dev_root, 4)

    def write_perftest(self, node: NsNode) -> None:
        """The perftest stand-in as `ib_write_bw` and `ib_write_lat` in the node's bin dir."""
        bin_dir = node.dir / "bin"
        bin_dir.mkdir(exist_ok=True)
        for tool in ("ib_write_bw", "ib_write_lat"):
            link = bin_dir / tool
            if not link.is_symlink():
                link.symlink_to(PERFTEST_STANDIN.resolve())

    def set_rdma(self, active: bool) -> None:
        """Every node's HCAs ACTIVE (doctor --fabric then measures each pair over RDMA too) or DOWN."""
        for node in self.nodes:
            self.write_rdma(node, active)

    def perftest_scale(self, i: int, scale: float | None) -> None:
        """Node i's HCA carries `scale` × the captured rate (None: the captured rate)."""
        f = self.nodes[i].dir / "bin" / "scale"
        if scale is None:
            f.unlink(missing_ok=True)
        else:
            f.write_text(f"{scale:g}\n")

    def write_cluster_file(self, path: str | os.PathLike[str] | None = None) -> Path:
        """A cluster.toml for these nodes, as a careful user would write it."""
        path = Path(path) if path else self.cluster_file
        lines = [
            f"# namespace fleet of {self.n} nodes (tests/fleet/netns.py)",
            f'name = "{self.name}"', "", "[defaults]", 'user = "root"',
            f'ssh_key = "{self.client_key}"', f'ssh_config = "{self.ssh_config}"',
            f'state_dir = "{self.workdir / "state"}"', 'gpus = "none"', 'memlock = "none"', "rdma = true",
            "ib_gid_index = 3", "",
        ]  # fmt: skip
        for node in self.nodes:
            lines += ["[[nodes]]", f'name = "{node.name}"', f'host = "{node.name}"',
                      f'fabric_ip = "{node.fabric_ip}"', f'fabric_ifname = "{node.fabric_if}"',
                      f'ib_hca = "{",".join(node.hcas)}"', ""]  # fmt: skip
        path.write_text("\n".join(lines))
        return path

    # -- faults ------------------------------------------------------------------------
    def ip(self, i: int, *args: str) -> None:
        """`ip ARGS` inside node i's namespace."""
        _run(IP, "-n", self.nodes[i].netns, *args)

    def set_mtu(self, i: int, mtu: int) -> None:
        self.ip(i, "link", "set", self.nodes[i].fabric_if, "mtu", str(mtu))

    def block(self, i: int, j: int) -> None:
        """Node i loses its route to node j's fabric address (j's packets reach i, i's answers don't leave)."""
        self.ip(i, "route", "add", "unreachable", f"{self.nodes[j].fabric_ip}/32")

    def unblock(self, i: int, j: int) -> None:
        self.ip(i, "route", "del", "unreachable", f"{self.nodes[j].fabric_ip}/32")

    def shape(self, i: int, mbit: float) -> None:
        """Node i's fabric link carries at most `mbit` Mbit/s each way: a token bucket (tc tbf) on
        the node's end of its veth and on the switch's end."""
        burst = "64kb"  # ≥ 7 jumbo frames: a smaller bucket drops TCP below the shaped rate
        args = ("root", "tbf", "rate", f"{mbit:g}mbit", "burst", burst, "latency", "50ms")
        _run(IP, "netns", "exec", self.nodes[i].netns, "tc", "qdisc", "replace", "dev", self.nodes[i].fabric_if, *args)
        _run(IP, "netns", "exec", self.switch, "tc", "qdisc", "replace", "dev", f"f{i}", *args)

    def drop(self, i: int, probability: float | None) -> None:
        """Node i's fabric interface drops this share of what it sends (None: stops dropping).
        iptables' statistic match, as this kernel has no netem."""
        ns, ifname = self.nodes[i].netns, self.nodes[i].fabric_if
        rule = ("OUTPUT", "-o", ifname, "-m", "statistic", "--mode", "random", "--probability")
        if probability is None:
            subprocess.run([IP, "netns", "exec", ns, "iptables", "-F", "OUTPUT"], capture_output=True)
        else:
            _run(IP, "netns", "exec", ns, "iptables", "-A", *rule, f"{probability:g}", "-j", "DROP")

    def hop_mtu(self, i: int, mtu: int) -> None:
        """The switch port of node i's fabric link (the veth's switch end) takes frames up to
        `mtu`: larger ones are dropped there, as by a switch port left at a smaller MTU."""
        _run(IP, "-n", self.switch, "link", "set", f"f{i}", "mtu", str(mtu))

    def processes(self, i: int) -> list[str]:
        """The command names of the processes running in node i's namespace."""
        pids = subprocess.run([IP, "netns", "pids", self.nodes[i].netns], capture_output=True, text=True).stdout
        names = []
        for pid in pids.split():
            with contextlib.suppress(OSError):
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        return names

    def listening(self, i: int) -> list[str]:
        """`ss -Hltn` inside node i's namespace: its listening TCP sockets."""
        out = subprocess.run([IP, "netns", "exec", self.nodes[i].netns, "ss", "-Hltn"], capture_output=True,
                             text=True).stdout  # fmt: skip
        return [line for line in out.splitlines() if line.strip()]

    def remove_hca(self, i: int, hca: str) -> None:
        shutil.rmtree(self.nodes[i].sys_root / "class/infiniband" / hca)

    def fabric_sshd(self) -> None:
        """An sshd listening on every node's fabric address, so that one node reaches another over
        the (shaped) fabric, as distribution's node-to-node copies do; the client settings for
        those addresses go into ssh_config and their host keys into known_hosts."""
        known, cfg = [], [f"Host {FABRIC_NET}.*\n  User root\n"]
        for node in self.nodes:
            _run(IP, "netns", "exec", node.netns, SSHD, "-f", str(node.dir / "sshd_config"),
                 "-o", f"ListenAddress={node.fabric_ip}", "-E", str(node.dir / "sshd-fabric.log"))  # fmt: skip
            kind, blob = Path(f"{node.dir / 'ssh_host_ed25519_key'}.pub").read_text().split()[:2]
            known.append(f"{node.fabric_ip} {kind} {blob}\n")
        # No multiplexing master: a copy's ssh ends with it, nothing stays in the namespace.
        cfg.append(
            client_options(self.client_key, self.known_hosts, self._cm_dir, 30).replace(
                "  ControlMaster auto\n", "  ControlMaster no\n"
            )
        )
        with self.known_hosts.open("a") as f:
            f.write("".join(known))
        with self.ssh_config.open("a") as f:
            f.write("".join(cfg))

    # -- helpers -----------------------------------------------------------------------
    def run(self, i: int, command: str, *, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """`ssh -F ssh_config node<i> COMMAND`."""
        return subprocess.run(["ssh", "-F", str(self.ssh_config), self.nodes[i].name, command], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip

    def close(self) -> None:
        for name in reversed(self._made):
            pids = subprocess.run([IP, "netns", "pids", name], capture_output=True, text=True).stdout.split()
            for pid in pids:  # only processes inside our own namespace: our sshds and their sessions
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run([IP, "netns", "del", name], capture_output=True)
        self._made.clear()
        shutil.rmtree(self._cm_dir, ignore_errors=True)

    def __enter__(self) -> NetnsFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def netns_fleet(n: int, workdir: str | os.PathLike[str], **kw: object) -> Iterator[NetnsFleet]:
    """Start an n-node namespace fleet under workdir; delete every namespace on exit."""
    fleet = NetnsFleet(n, workdir, **kw)  # type: ignore[arg-type]
    try:
        yield fleet
    finally:
        fleet.close()


def names_in_use(fleet_tag: str) -> Sequence[str]:
    """The namespaces of this machine that carry the tag (a test's check that close() left none)."""
    out = subprocess.run([IP, "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(fleet_tag)]


@contextlib.contextmanager
def shaped_fleet(n: int, workdir: str | os.PathLike[str], mbit: float, **kw: object) -> Iterator[NetnsFleet]:
    """A fleet of n nodes, every fabric link shaped to mbit; closed afterwards, leaving no name in use."""
    fleet = NetnsFleet(n, workdir, **kw)  # type: ignore[arg-type]
    try:
        for i in range(n):
            fleet.shape(i, mbit)
        yield fleet
    finally:
        fleet.close()
    assert names_in_use(fleet.tag) == []
