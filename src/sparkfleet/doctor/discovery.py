"""`sparkfleet init HOST…`: find each node's fabric over SSH and write a commented cluster.toml.

Per node, one bundled round trip (the doctor's probes): interfaces with addresses and MTU
(`ip -j addr`), the RDMA ports with state, link layer and GID table (sysfs), the GPUs, the
memlock limit, the login user and host name. Then, pure (`choose`):

1. candidate networks: the IPv4 networks of up, non-loopback interfaces that *every* node has
   an address in;
2. the fabric: among those, the ones whose address on every node is carried by a RoCE v2 GID
   of an ACTIVE port; without RoCE anywhere, the candidates that are not the SSH (management)
   network; one left is the fabric, several stop with the list and `--fabric-subnet`;
3. per node, the interface holding its address on that network (several: the RoCE-backed one,
   else stop with the list and `--ifname NODE=IFNAME`), the HCAs whose GID table carries the
   address, and the RoCE v2 GID index of it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkfleet.doctor.probes import gpu, limits, netif, rdma, user
from sparkfleet.doctor.probes.bundle import run_bundle
from sparkfleet.doctor.probes.netif import Interface, NetFacts
from sparkfleet.doctor.probes.rdma import RdmaFacts, RdmaPort
from sparkfleet.errors import ClusterError
from sparkfleet.importers.toml_text import value as toml
from sparkfleet.nodes.transport.base import Transport

PROBES: dict[str, list[str]] = {
    "netif": netif.command(),
    "rdma": rdma.command(),
    "gpu": gpu.GPU_COMMAND,
    "memlock": limits.COMMAND,
    "user": user.COMMAND,
    "host": ["sh", "-c", 'hostname; echo "${SSH_CONNECTION:-}"'],
}


@dataclass(frozen=True)
class Found:
    """What one node showed."""

    host: str
    hostname: str
    ssh_address: str | None  # the node's address the SSH session came in on
    user: str
    net: NetFacts
    rdma: RdmaFacts
    gpus: int
    memlock: str  # "unlimited" or the hard limit in bytes, as the cluster file takes it


@dataclass(frozen=True)
class Address:
    """One IPv4 address of one interface, and the RDMA ports whose GIDs carry it."""

    iface: Interface
    ip: str
    network: ipaddress.IPv4Network
    roce: tuple[RdmaPort, ...]


@dataclass(frozen=True)
class Choice:
    """The fabric of one node."""

    name: str
    found: Found
    address: Address
    gid_index: int | None


def probe(transport: Transport, host: str, *, timeout: float = 20.0) -> Found:
    """Ask one node; a node that cannot be asked raises naming it."""
    result, outs = run_bundle(transport, PROBES, timeout=timeout)
    if "netif" not in outs or "rdma" not in outs:
        raise ClusterError(f"{host}: the probes did not answer ({result.tail() or f'exit {result.exit_code}'})")
    try:
        net = netif.parse(outs["netif"].stdout)
        facts = rdma.parse(outs["rdma"].stdout)
        g = gpu.parse(outs["gpu"].stdout, outs["gpu"].exit_code, "", outs["gpu"].stderr)
        lim = limits.parse(outs["memlock"].stdout)
    except (ValueError, KeyError, IndexError) as exc:
        raise ClusterError(f"{host}: unexpected probe output ({exc})") from None
    if not net.addresses_known:
        raise ClusterError(f"{host}: `ip` (iproute2) is not installed, so its addresses are unknown")
    host_lines = [*outs["host"].stdout.splitlines(), "", ""]
    conn = host_lines[1].split()
    return Found(
        host=host,
        hostname=host_lines[0].strip(),
        ssh_address=conn[2] if len(conn) == 4 else None,
        user=user.parse(outs["user"].stdout),
        net=net,
        rdma=facts,
        gpus=len(g.gpus) if g.available else 0,
        memlock="unlimited" if lim.hard is None else str(lim.hard),
    )


def addresses(found: Found) -> list[Address]:
    """Every IPv4 address of an up, non-loopback interface, with the ports carrying it as RoCE v2."""
    out = []
    for iface in found.net.interfaces:
        if iface.loopback or iface.operstate == "DOWN":
            continue
        for ip, prefix in zip(iface.ipv4, iface.prefixes, strict=False):
            ports = tuple(p for p in found.rdma.ports if p.active and p.roce_v2_index(ip) is not None)
            out.append(Address(iface, ip, ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False), ports))
    return out


def _listing(nodes: Sequence[Found], network: ipaddress.IPv4Network) -> str:
    parts = []
    for f in nodes:
        mine = [a for a in addresses(f) if a.network == network]
        parts.append(f"{f.host} " + "/".join(f"{a.iface.name} {a.ip}" + (" RoCE" if a.roce else "") for a in mine))
    return ", ".join(parts)


def _usable(names: Sequence[str]) -> bool:
    return len(set(names)) == len(names) and all(n and n.replace("-", "").replace("_", "").isalnum() for n in names)


def node_names(nodes: Sequence[Found]) -> list[str]:
    """The nodes' host names where they are unique, else the SSH names given (when none is an
    address), else node1, node2, …"""
    for names in ([f.hostname.split(".")[0] for f in nodes], [f.host for f in nodes]):
        if _usable(names):
            return names
    return [f"node{i + 1}" for i in range(len(nodes))]


_DOMAIN = re.compile(r"^roceP\d+")


def twins(ports: Sequence[RdmaPort], carriers: Sequence[RdmaPort]) -> list[RdmaPort]:
    """ACTIVE ports that are the same physical port as a carrier under another PCIe domain: a
    DGX Spark's GB10 shows each 200G ConnectX-7 port as two x4 links, two RDMA devices
    (rocep1s0f1 and roceP2p1s0f1), and NCCL needs both for the full bandwidth, though only one
    holds the address (../shared/reference/engines.md, eugr's notes)."""
    names = {p.hca for p in carriers}
    return [p for p in ports if p.active and p not in carriers and _DOMAIN.sub("roce", p.hca) in names]


def choose(nodes: Sequence[Found], subnet: str | None = None, ifnames: Mapping[str, str] | None = None) -> list[Choice]:
    """The fabric address, interface, HCAs and GID index of every node, or one ClusterError that
    lists the candidates and the option that picks one."""
    ifnames = dict(ifnames or {})
    names = node_names(nodes)
    per_node = [addresses(f) for f in nodes]
    common = set.intersection(*({a.network for a in mine} for mine in per_node)) if per_node else set()
    ordered = sorted(common, key=lambda n: (int(n.network_address), n.prefixlen))
    if not ordered:
        have = "; ".join(f"{f.host}: " + (", ".join(f"{a.iface.name} {a.ip}/{a.network.prefixlen}" for a in mine)
                                          or "none") for f, mine in zip(nodes, per_node, strict=True))  # fmt: skip
        raise ClusterError(f"no IPv4 network holds an address of every node ({have}); put the fabric "
                           "interfaces on one subnet")  # fmt: skip
    if subnet is not None:
        try:
            wanted = ipaddress.IPv4Network(subnet, strict=False)
        except ValueError:
            raise ClusterError(f"--fabric-subnet {subnet!r} is not a network like 192.168.200.0/24") from None
        if wanted not in common:
            raise ClusterError(f"--fabric-subnet {wanted} is not a network every node is on; candidates: "
                               + "; ".join(f"{n} ({_listing(nodes, n)})" for n in ordered))  # fmt: skip
        picked = wanted
    else:
        roce = [n for n in ordered if all(any(a.roce for a in mine if a.network == n) for mine in per_node)]
        ssh_nets = {a.network for f, mine in zip(nodes, per_node, strict=True) for a in mine if a.ip == f.ssh_address}
        rest = roce or [n for n in ordered if n not in ssh_nets] or ordered
        if len(rest) > 1:
            why = "RoCE v2 on every node" if roce else "no RoCE v2 GID anywhere"
            raise ClusterError(
                f"several networks could be the fabric ({why}): "
                + "; ".join(f"{n} ({_listing(nodes, n)})" for n in rest)
                + "; pick one with --fabric-subnet CIDR"
            )
        picked = rest[0]
    out = []
    for name, f, mine in zip(names, nodes, per_node, strict=True):
        on = [a for a in mine if a.network == picked]
        chosen_if = ifnames.get(name) or ifnames.get(f.host)
        if chosen_if is not None:
            on = [a for a in on if a.iface.name == chosen_if]
            if not on:
                raise ClusterError(f"--ifname {name}={chosen_if}: no address in {picked} on that interface of "
                                   f"{f.host} ({_listing([f], picked)})")  # fmt: skip
        elif len(on) > 1 and sum(1 for a in on if a.roce) == 1:
            on = [a for a in on if a.roce]
        if len(on) > 1:
            raise ClusterError(f"{f.host} has several addresses in {picked}: "
                               + ", ".join(f"{a.iface.name} {a.ip}" + (" (RoCE v2)" if a.roce else "") for a in on)
                               + f"; pick one with --ifname {name}=IFNAME")  # fmt: skip
        a = on[0]
        index = a.roce[0].roce_v2_index(a.ip) if a.roce else None
        out.append(Choice(name, f, a, index))
    return out


def hca_list(c: Choice) -> str | None:
    """NCCL_IB_HCA for the node: the devices whose GIDs carry its fabric address, and their twins."""
    carriers = list(c.address.roce)
    hcas = list(dict.fromkeys(p.hca for p in [*carriers, *twins(c.found.rdma.ports, carriers)]))
    return ",".join(hcas) or None


def cluster_toml(
    name: str, choices: Sequence[Choice], hosts_given: Sequence[str], ssh: Mapping[str, str | int | None]
) -> str:
    """The cluster file, with what was seen on each node as comments."""
    picked = choices[0].address.network
    roce = all(c.address.roce for c in choices)
    lines = [
        f"# Written by `sparkfleet init {' '.join(hosts_given)}`: what each node showed over SSH.",
        f"# Fabric: {picked}, the network every node has an address in"
        + (", carried by a RoCE v2 GID on every node." if roce else " (no RoCE v2 GID seen: NCCL uses sockets)."),
        "# Node order is rank order: the first host given is the head (rank 0). Check with",
        "# `sparkfleet doctor --cluster THIS_FILE` (and with a recipe, per rank).",
        f"name = {toml(name)}",
        "",
        "[defaults]",
    ]
    users = {c.found.user for c in choices}
    if len(users) == 1:
        lines.append(f"user = {toml(users.pop())}")
    for key, given in ssh.items():
        if given is not None:
            lines.append(f"{key} = {toml(given)}")
    gpus = {c.found.gpus for c in choices}
    listed = "/".join(map(str, sorted(gpus)))
    lines.append(f"gpus = {toml('all' if min(gpus) > 0 else 'none')}  # nvidia-smi listed {listed} GPU(s) per node")
    memlocks = {c.found.memlock for c in choices}
    lock = "unlimited" if memlocks == {"unlimited"} else str(min(int(m) for m in memlocks if m != "unlimited"))
    lines.append(f"memlock = {toml(lock)}  # the lowest hard memlock limit seen (dockerd's, else the login shell's)")
    lines.append(f"rdma = {toml(roce)}")
    lines.append("")
    for c in choices:
        a = c.address
        lines += ["[[nodes]]", f"name = {toml(c.name)}", f"host = {toml(c.found.host)}"]
        lines.append(f"# {a.iface.name}: {a.ip}/{a.network.prefixlen}, MTU {a.iface.mtu}, {a.iface.operstate.lower()}")
        for p in a.roce:
            index = p.roce_v2_index(a.ip)
            lines.append(f"# {p.hca} port {p.port}: {p.state}, {p.link_layer}, RoCE v2 GID {index} = {a.ip}")
        others = [o for o in addresses(c.found) if o.ip != a.ip]
        if others:
            rest = ", ".join(f"{o.iface.name} {o.ip}/{o.network.prefixlen}" for o in others)
            lines.append(f"# not the fabric: {rest}")
        for p in twins(c.found.rdma.ports, a.roce):
            lines.append(f"# {p.hca} port {p.port}: {p.state}, the same physical port as {a.roce[0].hca} (twin link)")
        idle = [p for p in c.found.rdma.ports if p not in a.roce and p not in twins(c.found.rdma.ports, a.roce)]
        if idle:
            lines.append("# other RDMA ports: " + ", ".join(f"{p.hca}/{p.port} {p.state}" for p in idle))
        lines += [f"fabric_ip = {toml(a.ip)}", f"fabric_ifname = {toml(a.iface.name)}"]
        hcas = hca_list(c)
        if hcas:
            lines.append(f"ib_hca = {toml(hcas)}")
        if c.gid_index is not None:
            lines.append(f"ib_gid_index = {c.gid_index}")
        lines.append("")
    return "\n".join(lines)


def discover(hosts: Sequence[str], ssh: Mapping[str, str | int | None], user: str | None = None, *,
             accept_new: bool = False, timeout: float = 20.0) -> list[Found]:  # fmt: skip
    """Reach every host over SSH (user and ssh: what a cluster file's [defaults] would say) and
    probe them in parallel; one error naming every host that did not answer."""
    from sparkfleet.config.cluster import parse_cluster
    from sparkfleet.nodes.fanout import fan_out
    from sparkfleet.nodes.transport import connected

    defaults = {k: v for k, v in {"user": user, **ssh}.items() if v is not None}
    nodes = [{"name": f"h{i}", "host": h} for i, h in enumerate(hosts)]
    reach = parse_cluster({"name": "init", "defaults": defaults, "nodes": nodes}, "(init)")
    with connected(reach.nodes, accept_new_host_keys=accept_new, key=lambda n: n.host) as transports:
        group = fan_out(list(hosts), lambda h: probe(transports[h], h, timeout=timeout), workers=max(1, len(hosts)))
        found = group.raise_all()
    return [found[h] for h in hosts]
