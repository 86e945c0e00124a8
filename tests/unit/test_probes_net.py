"""RDMA sysfs, interfaces, listening ports and fabric reach: captures and real commands."""

from __future__ import annotations

import socket
from pathlib import Path

from sparkfleet.doctor.probes import netif, ports, rdma, reach
from sparkfleet.nodes.transport.local import LocalTransport
from tests.fleet.connectx import ipv4_gid, link_local_gid, write_dev, write_port
from tests.unit._captures import h200_section, vm


def test_rdma_cm_without_sysfs_devices_is_not_rdma_capable() -> None:
    # The H200 machine: /dev/infiniband holds only rdma_cm and /sys/class/infiniband is empty
    # (node-facts-h200.txt); this is what the probe's command prints there.
    listed = [line.split()[-1] for line in h200_section("ls /dev/infiniband").splitlines()[3:]]
    assert listed == ["rdma_cm"]
    facts = rdma.parse("## dev\n" + "\n".join(listed) + "\n## sysfs\n## netdev\n")
    assert facts.dev_nodes == ("rdma_cm",)
    assert not facts.capable


def _connectx_tree(root: Path) -> tuple[Path, Path]:
    """One ACTIVE RoCE port (GID 0/1 RoCE v1/v2 link-local, 2/3 RoCE v1/v2 of 192.168.200.11, the
    rest unpopulated) and one DOWN port without a netdev."""
    sys_root, dev_root = root / "sys", root / "dev"
    write_port(sys_root, "rocep1s0f0", "enp1s0f0np0", ("192.168.200.11",))
    write_port(sys_root, "rocep1s0f1", None, state="1: DOWN")
    write_dev(dev_root, 2)
    return sys_root, dev_root


def test_rdma_probe_reads_port_state_and_the_roce_v2_ipv4_gid(tmp_path: Path) -> None:
    sys_root, dev_root = _connectx_tree(tmp_path)
    out = LocalTransport().run(rdma.command(str(sys_root), str(dev_root))).stdout
    facts = rdma.parse(out)
    assert facts.capable
    assert [(p.hca, p.active) for p in facts.ports] == [("rocep1s0f0", True), ("rocep1s0f1", False)]
    port = facts.port_for_ip("192.168.200.11")
    assert port is not None and port.link_layer == "Ethernet"
    assert port.roce_v2_index() == 3 and port.roce_v2_index("192.168.200.11") == 3
    assert [g.index for g in port.gids] == [0, 1, 2, 3]
    assert facts.netdevs == {"rocep1s0f0": ("enp1s0f0np0",)}
    assert [(g.type, g.ipv4) for g in port.gids] == [
        ("IB/RoCE v1", None),
        ("RoCE v2", None),
        ("IB/RoCE v1", "192.168.200.11"),
        ("RoCE v2", "192.168.200.11"),
    ]


def test_fake_tree_gids_have_the_kernel_forms() -> None:
    # The shapes show_gids prints for a ConnectX with MAC 0c:42:a1:01:02:03 and 192.168.200.11.
    assert link_local_gid("0c:42:a1:01:02:03") == "fe80:0000:0000:0000:0e42:a1ff:fe01:0203"
    assert ipv4_gid("192.168.200.11") == "0000:0000:0000:0000:0000:ffff:c0a8:c80b"


def test_the_probe_follows_the_sysfs_root_the_node_names(tmp_path: Path) -> None:
    sys_root, dev_root = _connectx_tree(tmp_path)
    env = {"SPARKFLEET_SYSFS_ROOT": str(sys_root), "SPARKFLEET_DEV_ROOT": str(dev_root)}
    out = LocalTransport().run(["env", *(f"{k}={v}" for k, v in env.items()), *rdma.command()]).stdout
    assert rdma.parse(out).capable


def test_rdma_probe_on_this_machine_finds_nothing() -> None:
    facts = rdma.parse(LocalTransport().run(rdma.command()).stdout)
    assert not facts.capable


def test_ip_json_capture_gives_interfaces_with_addresses_and_mtu() -> None:
    facts = netif.parse(vm("netif-ip.txt"))
    assert facts.addresses_known
    lo = facts.with_address("127.0.0.1")
    assert lo is not None and lo.name == "lo" and lo.mtu == 65536
    assert {i.name for i in facts.interfaces} >= {"lo", "eth0"}
    # All of 127.0.0.0/8 is local (the loopback fleet's nodes live there); other networks
    # count only their own addresses.
    assert facts.with_address("127.0.1.12") is lo
    assert facts.with_address("192.0.2.3") is None


def test_sysfs_fallback_capture_has_mtus_but_no_addresses() -> None:
    facts = netif.parse(vm("netif-sysfs.txt"))
    assert not facts.addresses_known
    by_name = {i.name: i for i in facts.interfaces}
    assert by_name["lo"].mtu == 65536 and by_name["lo"].operstate == "UNKNOWN"
    assert by_name["eth0"].mtu == netif.parse(vm("netif-ip.txt")).with_address("192.0.2.2").mtu  # type: ignore[union-attr]


def test_ss_and_proc_captures_agree_on_the_listeners() -> None:
    want = {("0.0.0.0", 2024), ("127.0.0.5", 18081)}
    via_ss = ports.parse(vm("ports-ss.txt"))
    via_proc = ports.parse(vm("ports-proc.txt"))
    assert want <= {(item.address, item.port) for item in via_ss.listeners}
    assert want <= {(item.address, item.port) for item in via_proc.listeners}
    assert via_ss.holders(18080) and via_proc.holders(18080)  # the IPv6 wildcard listener
    assert not via_ss.holders(18082)


def test_ports_probe_sees_a_socket_this_test_opens() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        facts = ports.parse(LocalTransport().run(ports.COMMAND).stdout)
    assert [h.address for h in facts.holders(port)] == ["127.0.0.1"]


def test_reach_counts_a_refused_port_as_reachable_and_reports_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        open_port = s.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            closed_port = probe.getsockname()[1]  # bound, not listening: refused
            out = LocalTransport().run(reach.command([("127.0.0.1", open_port), ("127.0.0.1", closed_port)]))
    # The targets are tried at once, so they report in whatever order they finish.
    found = {r.port: r for r in reach.parse(out.stdout)}
    assert {port: r.reachable for port, r in found.items()} == {open_port: True, closed_port: True}
    assert found[open_port].detail == "connected" and found[closed_port].detail == "answers (connection refused)"


def test_a_target_that_printed_nothing_before_the_timeout_is_unreachable() -> None:
    out = "192.0.2.2 22 0 \n"  # the shape the command prints; the second target hung until `timeout`
    found = reach.parse(out, [("192.0.2.2", 22), ("198.51.100.7", 22)], 124)
    assert [(r.ip, r.reachable, r.detail) for r in found] == [
        ("192.0.2.2", True, "connected"),
        ("198.51.100.7", False, "timed out"),
    ]
