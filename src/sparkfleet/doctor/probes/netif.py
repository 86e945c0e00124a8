"""Network interfaces: `ip -j addr` (JSON), or sysfs `/sys/class/net/*/{mtu,operstate}` where
`ip` is not installed (no addresses then: seen on a cloud H200 image)."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

from sparkfleet.doctor.probes.fact import fixed


def command(sysfs: str = "/sys") -> list[str]:
    """The argv: `ip -j addr` when present, else a grep of the sysfs attributes."""
    script = (
        'if command -v ip >/dev/null 2>&1; then echo "## ip"; ip -j addr; '
        f'else echo "## sysfs"; grep -s -H . "{sysfs}"/class/net/*/mtu "{sysfs}"/class/net/*/operstate; '
        "fi; true"
    )
    return ["sh", "-c", script]


@dataclass(frozen=True)
class Interface:
    """One network interface; `ipv4` is empty when addresses are unknown."""

    name: str
    mtu: int
    operstate: str
    ipv4: tuple[str, ...]
    prefixes: tuple[int, ...] = ()
    loopback: bool = False

    def holds(self, ip: str) -> bool:
        """This interface answers for ip: one of its addresses, or (loopback) inside its
        network, as all of 127.0.0.0/8 is local on Linux."""
        if ip in self.ipv4:
            return True
        if not self.loopback:
            return False
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:  # a host name (fabric_ip left to default to the host): not an address here
            return False
        return any(
            addr in ipaddress.ip_network(f"{a}/{n}", strict=False)
            for a, n in zip(self.ipv4, self.prefixes, strict=False)
        )


@dataclass(frozen=True)
class NetFacts:
    """The node's interfaces; `addresses_known` is False on the sysfs fallback."""

    interfaces: tuple[Interface, ...]
    addresses_known: bool

    def with_address(self, ipv4: str) -> Interface | None:
        """The interface that holds this IPv4 address."""
        for iface in self.interfaces:
            if ipv4 in iface.ipv4:
                return iface
        for iface in self.interfaces:
            if iface.holds(ipv4):
                return iface
        return None


def parse_ip_json(text: str) -> tuple[Interface, ...]:
    """Parse `ip -j addr`."""
    out = []
    for entry in json.loads(text or "[]"):
        inet = [a for a in entry.get("addr_info", []) if a.get("family") == "inet" and "local" in a]
        out.append(
            Interface(
                name=entry["ifname"],
                mtu=int(entry.get("mtu", 0)),
                operstate=entry.get("operstate", "UNKNOWN"),
                ipv4=tuple(a["local"] for a in inet),
                prefixes=tuple(int(a.get("prefixlen", 32)) for a in inet),
                loopback="LOOPBACK" in entry.get("flags", ()),
            )
        )
    return tuple(out)


def parse_sysfs(text: str) -> tuple[Interface, ...]:
    """Parse `grep -H . /sys/class/net/*/{mtu,operstate}` lines."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        path, _, value = line.partition(":")
        parts = path.split("/class/net/", 1)[-1].split("/")
        if len(parts) == 2:
            found.setdefault(parts[0], {})[parts[1]] = value.strip()
    return tuple(
        Interface(name=name, mtu=int(v.get("mtu", 0)), operstate=v.get("operstate", "unknown").upper(), ipv4=())
        for name, v in sorted(found.items())
    )


def parse(stdout: str) -> NetFacts:
    """Parse the output of `command`."""
    head, _, body = stdout.partition("\n")
    if head.strip() == "## ip":
        return NetFacts(interfaces=parse_ip_json(body), addresses_known=True)
    if head.strip() == "## sysfs":
        return NetFacts(interfaces=parse_sysfs(body), addresses_known=False)
    raise ValueError("not the netif probe's output")


FACT = fixed("net", command(), lambda out: parse(out.stdout), run_as="netif")
