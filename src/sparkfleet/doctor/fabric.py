"""The network checks, per rank: where a multi-node launch breaks when a NIC or address is mixed up.

Each rank's *effective* env (what `plan` gives it, whichever layer set the value) is checked
against its own node's facts:

    net.socket_ifname  NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME select interfaces that exist on
                       the node, and one of them holds its fabric address
    rdma.hca           every NCCL_IB_HCA device exists on the node and has an ACTIVE port
    rdma.gid_index     NCCL_IB_GID_INDEX names a RoCE v2 GID of the node's fabric address
    net.advertise      SGLANG_HOST_IP / VLLM_HOST_IP and --dist-init-addr / --master-addr are
                       fabric addresses (the node's own, the head's)
    fabric.reachable   the node holds its fabric_ip and reaches every other node's fabric
                       address on the deployment's rendezvous ports (full mesh)
    fabric.mtu         every fabric interface has the same MTU (the odd nodes are named)

NCCL's selection syntax (NCCL env docs): a comma list of prefixes, `=` for exact names, `^` to
exclude; loopback only when named. Gloo takes a comma list of exact names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkfleet.doctor.probes.facts import NodeFacts
from sparkfleet.doctor.probes.netif import Interface
from sparkfleet.doctor.probes.rdma import RdmaPort
from sparkfleet.doctor.targets import FLEET, Check, DoctorSpec, Status
from sparkfleet.plan.flags import flag_value

SOCKET_KEYS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
HOST_IP_KEYS = ("SGLANG_HOST_IP", "VLLM_HOST_IP")
RENDEZVOUS_FLAGS = ("--dist-init-addr", "--master-addr")


@dataclass(frozen=True)
class Selection:
    """A parsed NCCL interface/HCA list: items, exact or prefix match, include or exclude."""

    items: tuple[str, ...]
    exact: bool
    exclude: bool

    @classmethod
    def parse(cls, value: str) -> Selection:
        exclude = value.startswith("^")
        rest = value[1:] if exclude else value
        exact = rest.startswith("=")
        rest = rest[1:] if exact else rest
        return cls(tuple(x.strip() for x in rest.split(",") if x.strip()), exact, exclude)

    def matches(self, name: str, item: str) -> bool:
        return name == item if self.exact else name.startswith(item)

    def selects(self, name: str) -> bool:
        named = any(self.matches(name, i) for i in self.items)
        return not named if self.exclude else named


def _iface_list(ifaces: Sequence[Interface]) -> str:
    return ", ".join(i.name for i in ifaces) or "none"


def _fabric_iface(fabric_ip: str, f: NodeFacts) -> Interface | None:
    return f.net.with_address(fabric_ip) if f.net is not None else None


def socket_ifname_checks(
    node: str, fabric_ip: str, env: Mapping[str, tuple[str, str]], f: NodeFacts, multi: bool
) -> list[tuple[str, str, str, str]]:
    """(status, evidence, fix, key) per socket-interface key of one rank (as `Check` fields)."""
    if f.net is None or not f.net.addresses_known:
        return []
    ifaces = f.net.interfaces
    fabric = _fabric_iface(fabric_ip, f)
    where = f"its fabric address {fabric_ip} is on {fabric.name}" if fabric else f"no interface holds {fabric_ip}"
    out: list[tuple[str, str, str, str]] = []
    for key in SOCKET_KEYS:
        if key not in env:
            # NCCL's own pick is a hazard only where the node has several addressed interfaces.
            addressed = [i for i in ifaces if i.ipv4 and not i.loopback and not i.name.startswith("docker")]
            if multi and key == "NCCL_SOCKET_IFNAME" and len(addressed) > 1:
                out.append(("warn", f"{key} unset: NCCL picks an interface by itself (ib*, then any but lo and "
                            f"docker*), maybe the management one; {where}",
                            f"set fabric_ifname = \"{fabric.name if fabric else '…'}\" for {node} in the cluster file",
                            key))  # fmt: skip
            continue
        value, source = env[key]
        shown = f"{key}={value} ({source})"
        if key == "GLOO_SOCKET_IFNAME":
            names = [x.strip() for x in value.split(",") if x.strip()]
            present = {i.name: i for i in ifaces}
            chosen = [present[n] for n in names if n in present]
            missing = [n for n in names if n not in present]
        else:
            sel = Selection.parse(value)
            chosen = [i for i in ifaces if sel.selects(i.name) and (not i.loopback or not sel.exclude)]
            missing = [] if chosen else list(sel.items)
        fix = (f"set {key} to {fabric.name} for {node}: fabric_ifname = \"{fabric.name}\" in the cluster file, "
               f"and drop {key} from the {source} layer if it sets one value for every node"
               if fabric else "configure the fabric interface, or fix fabric_ip")  # fmt: skip
        if (missing and key == "GLOO_SOCKET_IFNAME") or not chosen:
            what = ", ".join(missing) or value
            out.append(("fail", f"{shown}: no interface {what} on {node} (has: {_iface_list(ifaces)}); {where}",
                        fix, key))  # fmt: skip
            continue
        holding = [i for i in chosen if i.holds(fabric_ip)]
        if not holding:
            out.append(("fail", f"{shown} selects {_iface_list(chosen)} on {node}, none holds the fabric address "
                        f"{fabric_ip}; {where}", fix, key))  # fmt: skip
        elif len(holding) < len(chosen):
            others = [i.name for i in chosen if i not in holding]
            out.append(("warn", f"{shown} selects {_iface_list(chosen)}: {', '.join(others)} not on the fabric",
                        f"name only {holding[0].name} (NCCL: ={holding[0].name})", key))  # fmt: skip
        else:
            i = holding[0]
            out.append(("pass", f"{shown} → {i.name} ({fabric_ip}, MTU {i.mtu})", "", key))
    return out


def _ib_ports(value: str, ports: Sequence[RdmaPort]) -> tuple[list[RdmaPort], list[str], Selection]:
    """The ports NCCL_IB_HCA selects (items may carry `:port`) and the items matching nothing."""
    sel = Selection.parse(value)
    chosen: list[RdmaPort] = []
    missing: list[str] = []
    for item in sel.items:
        dev, _, num = item.partition(":")
        hits = [p for p in ports if sel.matches(p.hca, dev) and (not num or str(p.port) == num)]
        if not hits and not sel.exclude:
            missing.append(item)
        chosen += [p for p in hits if p not in chosen]
    if sel.exclude:
        chosen = [p for p in ports if p not in chosen]
    return chosen, missing, sel


def hca_checks(fabric_ip: str, env: Mapping[str, tuple[str, str]], f: NodeFacts) -> list[tuple[str, str, str, str]]:
    """rdma.hca and rdma.gid_index of one rank, as (status, evidence, fix, check id)."""
    r = f.rdma
    if r is None:
        return []
    out: list[tuple[str, str, str, str]] = []
    ports = list(r.ports)
    have = ", ".join(sorted({f"{p.hca}/{p.port} {p.state}" for p in ports})) or "no RDMA device in sysfs"
    carrier = r.port_for_ip(fabric_ip)
    selected = ports
    if "NCCL_IB_HCA" in env:
        value, source = env["NCCL_IB_HCA"]
        shown = f"NCCL_IB_HCA={value} ({source})"
        chosen, missing, sel = _ib_ports(value, ports)
        inactive = [p for p in chosen if not p.active]
        fix = (f"set ib_hca = \"{carrier.hca}\" for this node in the cluster file" if carrier
               else "list the node's ACTIVE RoCE devices (ls /sys/class/infiniband)")  # fmt: skip
        if missing:
            out.append(("fail", f"{shown}: {', '.join(missing)} not on this node (has: {have})", fix, "rdma.hca"))
        elif not chosen:
            out.append(("fail", f"{shown} selects no device (has: {have})", fix, "rdma.hca"))
        elif inactive and (sel.exact or len(inactive) == len(chosen)):
            down = ", ".join(f"{p.hca}/{p.port} {p.state}" for p in inactive)
            out.append(("fail", f"{shown}: not ACTIVE: {down}", "bring the port up (cable, switch port, "
                        "ip link set DEV up), or drop it from NCCL_IB_HCA", "rdma.hca"))  # fmt: skip
        elif carrier is not None and carrier not in chosen:
            out.append(("warn", f"{shown}: none of {', '.join(p.hca for p in chosen)} carries {fabric_ip} "
                        f"(that is {carrier.hca})", fix, "rdma.hca"))  # fmt: skip
        else:
            act = ", ".join(f"{p.hca}/{p.port} {p.state} {p.link_layer}" for p in chosen if p.active)
            out.append(("pass", f"{shown}: {act}", "", "rdma.hca"))
        selected = [p for p in chosen if p.active]
    if "NCCL_IB_GID_INDEX" in env:
        value, source = env["NCCL_IB_GID_INDEX"]
        shown = f"NCCL_IB_GID_INDEX={value} ({source})"
        right = carrier.roce_v2_index(fabric_ip) if carrier else None
        fix = (f"set ib_gid_index = {right} for this node (RoCE v2 of {fabric_ip} on {carrier.hca})"
               if carrier and right is not None else f"put {fabric_ip} on a RoCE port's netdev")  # fmt: skip
        try:
            index = int(value)
        except ValueError:
            out.append(("fail", f"{shown} is not a number", fix, "rdma.gid_index"))
            return out
        if index < 0:
            out.append(("pass", f"{shown}: NCCL picks the RoCE v2 GID itself", "", "rdma.gid_index"))
            return out
        seen = []
        for p in selected or ports:
            g = p.gid(index)
            if g is not None and g.type == "RoCE v2" and g.ipv4 == fabric_ip:
                out.append(("pass", f"{shown}: {p.hca}/{p.port} GID {index} is RoCE v2 of {fabric_ip}", "",
                            "rdma.gid_index"))  # fmt: skip
                return out
            seen.append(f"{p.hca}/{p.port} GID {index}: " + (f"{g.type} {g.ipv4 or g.gid}" if g else "unpopulated"))
        out.append(("fail", f"{shown} is not a RoCE v2 GID of {fabric_ip}: {'; '.join(seen) or have}", fix,
                    "rdma.gid_index"))  # fmt: skip
    return out


def advertise_checks(
    node: str, fabric_ip: str, head_fabric_ip: str, env: Mapping[str, tuple[str, str]],
    argv: Sequence[str], f: NodeFacts,
) -> list[tuple[str, str, str]]:  # fmt: skip
    """net.advertise of one rank: (status, evidence, fix) per address the engine tells its peers."""
    wanted: list[tuple[str, str, str, str]] = []  # (what, address, expected, whose)
    for key in HOST_IP_KEYS:
        if key in env:
            value, source = env[key]
            wanted.append((f"{key}={value} ({source})", value, fabric_ip, f"{node}'s own"))
    for flag in RENDEZVOUS_FLAGS:
        given = flag_value(argv, flag)
        if given:
            host = given.rsplit(":", 1)[0] if flag == "--dist-init-addr" else given
            wanted.append((f"{flag} {given}", host.strip("[]"), head_fabric_ip, "the head's"))
    out = []
    for what, address, expected, whose in wanted:
        if address == expected:
            out.append(("pass", f"{what}: {whose} fabric address", ""))
            continue
        on = f.net.with_address(address) if f.net is not None and expected == fabric_ip else None
        where = f" ({address} is on {on.name})" if on else ""
        out.append(("fail", f"{what} is not a fabric address: {whose} is {expected}{where}",
                    f"let sparkfleet set it (drop it from the recipe), or set it to {expected}"))  # fmt: skip
    return out


def mesh_check(node: str, f: NodeFacts, peers: Mapping[str, str]) -> tuple[str, str, str] | None:
    """fabric.reachable from one node to every other (peers: fabric ip → node name)."""
    if not f.reach:
        return None
    untested = [r for r in f.reach if not r.tested]
    if untested:
        return ("warn", untested[0].detail, "install bash and coreutils' timeout on the node")
    bad = [r for r in f.reach if not r.reachable]
    if bad:
        listing = "; ".join(f"{node} → {peers.get(r.ip, r.ip)} {r.ip}:{r.port}: {r.detail}" for r in bad)
        return ("fail", listing, f"check the fabric link, addresses and routes (ip route get PEER_IP on {node})")
    names = sorted({peers.get(r.ip, r.ip) for r in f.reach})
    ports = sorted({r.port for r in f.reach})
    return ("pass", f"{node} → {', '.join(names)} on port {', '.join(map(str, ports))}: answered", "")


def mtu_checks(known: Mapping[str, tuple[str, int]], head: str | None) -> list[tuple[str, str, str, str]]:
    """fabric.mtu: the fleet's MTU if one, else each node off the common value: (node, status, evidence, fix)."""
    if len(known) < 2:
        return []
    counts = Counter(mtu for _, mtu in known.values())
    top = max(counts.values())
    common = [m for m, c in counts.items() if c == top]
    ref = known[head][1] if head is not None and head in known and known[head][1] in common else common[0]
    if len(counts) == 1:
        return [(FLEET, "pass", f"MTU {ref} on every fabric interface", "")]
    listing = ", ".join(f"{name} {iface} {mtu}" for name, (iface, mtu) in known.items())
    return [
        (name, "fail", f"fabric interface {iface} has MTU {mtu}, the others {ref} ({listing})",
         f"ip link set {iface} mtu {ref} on {name} (and in its network config)")
        for name, (iface, mtu) in known.items() if mtu != ref
    ]  # fmt: skip


def _fabric_ifaces(spec: DoctorSpec, facts: Mapping[str, NodeFacts]) -> dict[str, tuple[str, int]]:
    out = {}
    for t in spec.nodes:
        iface = _fabric_iface(t.fabric_ip, facts[t.name]) if facts[t.name].reachable else None
        if iface is not None:
            out[t.name] = (iface.name, iface.mtu)
    return out


def evaluate_network(spec: DoctorSpec, facts: Mapping[str, NodeFacts]) -> list[Check]:
    """Every network check, per node in rank order, then the fleet's MTU."""
    out: list[Check] = []
    multi = len(spec.nodes) > 1
    head = next((n for n in spec.nodes if n.head), spec.nodes[0])
    peers = {n.fabric_ip: n.name for n in spec.nodes}
    for t in spec.nodes:
        f = facts[t.name]
        if not f.reachable:
            continue
        env = t.env_map()
        if f.net is not None and f.net.addresses_known and _fabric_iface(t.fabric_ip, f) is None:
            have = ", ".join(f"{i.name} {'/'.join(i.ipv4) or '-'}" for i in f.net.interfaces)
            out.append(Check("fabric.reachable", t.name, "fail",
                             f"no interface holds fabric_ip {t.fabric_ip} (has: {have})",
                             "fix fabric_ip in the cluster file or configure the fabric interface"))  # fmt: skip
        else:
            mesh = mesh_check(t.name, f, peers)
            if mesh is not None:
                status, evidence, fix = mesh
                out.append(Check("fabric.reachable", t.name, _status(status), evidence, fix))
        for status, evidence, fix, _key in socket_ifname_checks(t.name, t.fabric_ip, env, f, multi):
            out.append(Check("net.socket_ifname", t.name, _status(status), evidence, fix))
        if t.rdma_required or (t.rdma and not multi_ib_disabled(env)):
            for status, evidence, fix, check_id in hca_checks(t.fabric_ip, env, f):
                out.append(Check(check_id, t.name, _status(status), evidence, fix))
        for status, evidence, fix in advertise_checks(t.name, t.fabric_ip, head.fabric_ip, env, t.argv, f):
            out.append(Check("net.advertise", t.name, _status(status), evidence, fix))
    for node, status, evidence, fix in mtu_checks(_fabric_ifaces(spec, facts), head.name):
        out.append(Check("fabric.mtu", node, _status(status), evidence, fix))
    return out


def multi_ib_disabled(env: Mapping[str, tuple[str, str]]) -> bool:
    """NCCL will not use the IB/RoCE transport with this env."""
    return env.get("NCCL_IB_DISABLE", ("0", ""))[0] == "1" or env.get("NCCL_NET", ("", ""))[0].lower() == "socket"


def _status(value: str) -> Status:
    assert value in ("pass", "warn", "fail")
    return value  # type: ignore[return-value]
