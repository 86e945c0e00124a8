"""RDMA devices from sysfs (`/sys/class/infiniband/*/ports/*`) and `/dev/infiniband`.

Layout per the kernel ABI (Documentation/ABI/testing/sysfs-class-infiniband): `state`
("4: ACTIVE"), `link_layer` ("Ethernet" = RoCE), `gids/<i>` (IPv4-mapped
"0000:...:ffff:c0a8:c801"), `gid_attrs/types/<i>` ("RoCE v2"), `gid_attrs/ndevs/<i>` (netdev).
A node with `/dev/infiniband/rdma_cm` but an empty `/sys/class/infiniband` (seen on a cloud
H200) has no RDMA device: only ports found in sysfs count.

The roots default to `$SPARKFLEET_SYSFS_ROOT` / `$SPARKFLEET_DEV_ROOT` on the node, else /sys and
/dev: RDMA hardware cannot exist on a test machine, so a test fleet's nodes point these at a
sysfs tree laid out like a ConnectX's (tests/fleet/connectx.py); everything else is real.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.doctor.probes.fact import fixed

_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


SYSFS_ROOT = "${SPARKFLEET_SYSFS_ROOT:-/sys}"
DEV_ROOT = "${SPARKFLEET_DEV_ROOT:-/dev}"


def command(sysfs: str = SYSFS_ROOT, dev: str = DEV_ROOT) -> list[str]:
    """The argv that dumps the RDMA sysfs tree as `path:value` lines (grep -H)."""
    ib = f"{sysfs}/class/infiniband"
    script = (
        f'echo "## dev"; ls -1 "{dev}/infiniband" 2>/dev/null; '
        'echo "## sysfs"; '
        f'for p in "{ib}"/*/ports/*; do [ -d "$p" ] || continue; '
        'grep -s -H . "$p/state" "$p/link_layer" "$p"/gids/* "$p"/gid_attrs/types/* '
        '"$p"/gid_attrs/ndevs/*; done; '
        'echo "## netdev"; '
        f'for d in "{ib}"/*/device/net/*; do [ -e "$d" ] && echo "$d"; done; true'
    )
    return ["sh", "-c", script]


@dataclass(frozen=True)
class Gid:
    """One populated GID table entry."""

    index: int
    gid: str
    type: str
    netdev: str

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
        groups = self.gid.split(":")
        if len(groups) != 8 or groups[:6] != ["0000"] * 5 + ["ffff"]:
            return None
        raw = bytes.fromhex(groups[6] + groups[7])
        return ".".join(str(b) for b in raw)


@dataclass(frozen=True)
class RdmaPort:
    """One port of one RDMA device (HCA)."""

    hca: str
    port: int
    state: str
    link_layer: str
    gids: tuple[Gid, ...]

    @property
    def active(self) -> bool:
        return self.state.endswith("ACTIVE")

    def gid(self, index: int) -> Gid | None:
        """The populated GID at this index, or None."""
        return next((g for g in self.gids if g.index == index), None)

    def roce_v2_index(self, ipv4: str | None = None) -> int | None:
        """The GID index NCCL_IB_GID_INDEX should name: RoCE v2 with an IPv4 (that one, if given)."""
        for gid in self.gids:
            if gid.type == "RoCE v2" and gid.ipv4 and (ipv4 is None or gid.ipv4 == ipv4):
                return gid.index
        return None


@dataclass(frozen=True)
class RdmaFacts:
    """RDMA devices of a node."""

    dev_nodes: tuple[str, ...]
    ports: tuple[RdmaPort, ...]
    netdevs: dict[str, tuple[str, ...]]

    @property
    def capable(self) -> bool:
        """At least one active port in sysfs and the verbs device nodes to reach it."""
        return any(p.active for p in self.ports) and any(n.startswith("uverbs") for n in self.dev_nodes)

    def port_for_ip(self, ipv4: str) -> RdmaPort | None:
        """The port whose GID table carries this IPv4 address."""
        for port in self.ports:
            if any(g.ipv4 == ipv4 for g in port.gids):
                return port
        return None


def parse(stdout: str) -> RdmaFacts:
    """Parse the output of `command`."""
    section = ""
    dev_nodes: list[str] = []
    fields: dict[tuple[str, int], dict[str, str]] = {}
    gid_parts: dict[tuple[str, int, int], dict[str, str]] = {}
    netdevs: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        if not line.strip():
            continue
        if section == "dev":
            dev_nodes.append(line.strip())
        elif section == "sysfs":
            path, _, value = line.partition(":")
            rel = path.split("/class/infiniband/", 1)[-1].split("/")
            # rel: hca, "ports", port, then "state" | "link_layer" | "gids", i | "gid_attrs", kind, i
            if len(rel) < 4 or rel[1] != "ports":
                continue
            key = (rel[0], int(rel[2]))
            port_fields = fields.setdefault(key, {})
            if rel[3] in ("state", "link_layer"):
                port_fields[rel[3]] = value.strip()
            elif rel[3] == "gids" and len(rel) == 5:
                gid_parts.setdefault((*key, int(rel[4])), {})["gid"] = value.strip()
            elif rel[3] == "gid_attrs" and len(rel) == 6:
                gid_parts.setdefault((*key, int(rel[5])), {})[rel[4]] = value.strip()
        elif section == "netdev":
            rel = line.strip().split("/class/infiniband/", 1)[-1].split("/")
            if len(rel) == 4:
                netdevs.setdefault(rel[0], []).append(rel[3])
    ports = []
    for (hca, num), values in sorted(fields.items()):
        gids = tuple(
            Gid(index=i, gid=g["gid"], type=g.get("types", ""), netdev=g.get("ndevs", ""))
            for (h, p, i), g in sorted(gid_parts.items())
            if h == hca and p == num and g.get("gid", _ZERO_GID) != _ZERO_GID
        )
        ports.append(
            RdmaPort(
                hca=hca,
                port=num,
                state=values.get("state", ""),
                link_layer=values.get("link_layer", ""),
                gids=gids,
            )
        )
    return RdmaFacts(
        dev_nodes=tuple(dev_nodes),
        ports=tuple(ports),
        netdevs={k: tuple(v) for k, v in netdevs.items()},
    )


FACT = fixed("rdma", command(), lambda out: parse(out.stdout))
