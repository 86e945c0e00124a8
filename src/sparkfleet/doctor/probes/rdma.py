"""RDMA devices from sysfs (`/sys/class/infiniband/*/ports/*`) and `/dev/infiniband`.

Layout per the kernel ABI (Documentation/ABI/testing/sysfs-class-infiniband): `state`
("4: ACTIVE"), `link_layer` ("Ethernet" = RoCE), `gids/<i>` (IPv4-mapped
"0000:...:ffff:c0a8:c801"), `gid_attrs/types/<i>` ("RoCE v2"), `gid_attrs/ndevs/<i>` (netdev),
`rate` ("200 Gb/sec (4X HDR)"); the HCA's PCIe link from
`<hca>/device/current_link_speed` ("32.0 GT/s PCIe") and `current_link_width` ("4"): what one HCA
can carry is the smaller of its port rate and its PCIe link (a DGX Spark's ConnectX-7 shows each
200G port as two HCAs, each behind a PCIe Gen5 x4 link of about 126 Gbit/s).
A node with `/dev/infiniband/rdma_cm` but an empty `/sys/class/infiniband` (seen on a cloud
H200) has no RDMA device: only ports found in sysfs count.

The roots default to `$SPARKFLEET_SYSFS_ROOT` / `$SPARKFLEET_DEV_ROOT` on the node, else /sys and
/dev: RDMA hardware cannot exist on a test machine, so a test fleet's nodes point these at a
sysfs tree laid out like a ConnectX's (tests/fleet/connectx.py); everything else is real.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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
        'grep -s -H . "$p/state" "$p/link_layer" "$p/rate" "$p"/gids/* "$p"/gid_attrs/types/* '
        '"$p"/gid_attrs/ndevs/*; done; '
        'echo "## pcie"; '
        f'for d in "{ib}"/*/device; do [ -d "$d" ] || continue; '
        'grep -s -H . "$d/current_link_speed" "$d/current_link_width"; done; '
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
    rate_gbps: float | None = None  # sysfs `rate`: the port's link speed

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
    pcie_gbps: dict[str, float] = field(default_factory=dict)  # per HCA: its PCIe link's data rate

    def expected_gbps(self, port: RdmaPort) -> float | None:
        """What one port can carry: its link rate, capped by its HCA's PCIe link (None: unknown)."""
        known = [x for x in (port.rate_gbps, self.pcie_gbps.get(port.hca)) if x]
        return min(known) if known else None

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
    pcie: dict[str, dict[str, str]] = {}
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
            if rel[3] in ("state", "link_layer", "rate"):
                port_fields[rel[3]] = value.strip()
            elif rel[3] == "gids" and len(rel) == 5:
                gid_parts.setdefault((*key, int(rel[4])), {})["gid"] = value.strip()
            elif rel[3] == "gid_attrs" and len(rel) == 6:
                gid_parts.setdefault((*key, int(rel[5])), {})[rel[4]] = value.strip()
        elif section == "pcie":
            path, _, value = line.partition(":")
            rel = path.split("/class/infiniband/", 1)[-1].split("/")
            if len(rel) == 3:
                pcie.setdefault(rel[0], {})[rel[2]] = value.strip()
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
                rate_gbps=parse_rate(values.get("rate", "")),
            )
        )
    return RdmaFacts(
        dev_nodes=tuple(dev_nodes),
        ports=tuple(ports),
        netdevs={k: tuple(v) for k, v in netdevs.items()},
        pcie_gbps={
            hca: bw
            for hca, v in pcie.items()
            if (bw := pcie_gbps(v.get("current_link_speed", ""), v.get("current_link_width", "")))
        },
    )


def parse_rate(text: str) -> float | None:
    """sysfs `rate` ("200 Gb/sec (4X HDR)", "2.5 Gb/sec (1X SDR)") in Gbit/s; None when unreadable."""
    m = re.match(r"\s*([\d.]+) Gb/sec", text)
    return float(m.group(1)) if m else None


def pcie_gbps(speed: str, width: str) -> float | None:
    """A PCIe link's data rate in Gbit/s from sysfs `current_link_speed` ("32.0 GT/s PCIe") and
    `current_link_width` ("4"): GT/s × lanes × the encoding's share (8b/10b up to 5 GT/s, 128b/130b above)."""
    m = re.match(r"\s*([\d.]+) GT/s", speed)
    if not m or not width.strip().isdigit() or int(width) <= 0:
        return None
    gts = float(m.group(1))
    return gts * int(width) * (0.8 if gts <= 5.0 else 128 / 130)


FACT = fixed("rdma", command(), lambda out: parse(out.stdout))
