"""A sysfs tree laid out like a ConnectX-7's RoCE ports, for nodes where RDMA cannot exist.

This machine's kernel has no InfiniBand subsystem (`# CONFIG_INFINIBAND is not set`), and the
lent H200 shows an empty /sys/class/infiniband (tests/fixtures/h200), so no real ConnectX tree
can be captured here. The layout follows the kernel ABI (Documentation/ABI/testing/
sysfs-class-infiniband) and what `show_gids` and the Spark launchers read
(../shared/reference/engines.md §5.2): per port `state` ("4: ACTIVE"), `link_layer`
("Ethernet" = RoCE), `gids/<i>`, `gid_attrs/types/<i>` ("IB/RoCE v1" | "RoCE v2") and
`gid_attrs/ndevs/<i>` for populated entries, unpopulated entries all zeros; the backing netdev
under `<hca>/device/net/`; the port's `rate` ("200 Gb/sec (4X HDR)") and the HCA's PCIe link
(`device/current_link_speed` "32.0 GT/s PCIe", `current_link_width` "4": a Spark's ConnectX-7
reaches the GB10 through two PCIe Gen5 x4 links, one per twin HCA).
A RoCE port's table starts with the link-local GID (from the MAC) as v1 and v2, then each IPv4
address, IPv4-mapped, as v1 and v2: index 3 is RoCE v2 of the first
address, the NCCL_IB_GID_INDEX the Spark recipes pin.

The rdma probe reads it through `$SPARKFLEET_SYSFS_ROOT` / `$SPARKFLEET_DEV_ROOT`.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
TABLE_SIZE = 8  # real tables have 128+ entries, all zero past the populated ones


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _groups(raw: bytes) -> str:
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


def link_local_gid(mac: str) -> str:
    """fe80::/64 with the EUI-64 interface id of mac, as the kernel fills GID 0."""
    octets = bytes.fromhex(mac.replace(":", ""))
    eui = bytes([octets[0] ^ 0x02, *octets[1:3], 0xFF, 0xFE, *octets[3:]])
    return _groups(bytes.fromhex("fe80000000000000") + eui)


def ipv4_gid(ipv4: str) -> str:
    """The IPv4-mapped GID (::ffff:a.b.c.d) of an address."""
    return _groups(bytes(10) + b"\xff\xff" + ipaddress.IPv4Address(ipv4).packed)


def write_port(sys_root: Path, hca: str, netdev: str | None, addresses: tuple[str, ...] = (), *,
               state: str = "4: ACTIVE", port: int = 1, mac: str = "0c:42:a1:00:00:01",
               link_layer: str = "Ethernet", rate: str = "200 Gb/sec (4X HDR)",
               pcie: tuple[str, str] = ("32.0 GT/s PCIe", "4")) -> Path:  # fmt: skip
    """One RDMA port of hca backed by netdev (None: a port with no netdev, no GIDs)."""
    base = sys_root / "class/infiniband" / hca
    p = base / "ports" / str(port)
    _write(p / "state", state)
    _write(p / "link_layer", link_layer)
    _write(p / "rate", rate)
    _write(base / "device/current_link_speed", pcie[0])
    _write(base / "device/current_link_width", pcie[1])
    entries: list[tuple[str, str]] = []
    if netdev is not None:
        for gid in (link_local_gid(mac), *(ipv4_gid(a) for a in addresses)):
            entries += [(gid, "IB/RoCE v1"), (gid, "RoCE v2")]
        (base / "device/net" / netdev).mkdir(parents=True, exist_ok=True)
    for i in range(max(TABLE_SIZE, len(entries))):
        gid, kind = entries[i] if i < len(entries) else (ZERO_GID, "")
        _write(p / "gids" / str(i), gid)
        if kind and netdev is not None:
            _write(p / "gid_attrs/types" / str(i), kind)
            _write(p / "gid_attrs/ndevs" / str(i), netdev)
    return p


def write_dev(dev_root: Path, uverbs: int) -> None:
    """/dev/infiniband with rdma_cm and uverbs0..N-1 (plain files: the probe only lists them)."""
    for name in ("rdma_cm", *(f"uverbs{i}" for i in range(uverbs))):
        _write(dev_root / "infiniband" / name, "")
