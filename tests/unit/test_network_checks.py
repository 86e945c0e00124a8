"""The per-rank network checks and init's fabric choice, as pure functions of facts: the VM's
captured `ip -j addr`, made into Spark-like nodes, and ConnectX-style sysfs trees read by the
real rdma probe."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sparkfleet.doctor.checks import evaluate
from sparkfleet.doctor.discovery import Found, choose, cluster_toml, hca_list
from sparkfleet.doctor.fabric import Selection
from sparkfleet.doctor.probes import netif, rdma
from sparkfleet.doctor.probes.facts import NodeFacts
from sparkfleet.doctor.probes.netif import NetFacts
from sparkfleet.doctor.targets import DoctorSpec, NodeTarget
from sparkfleet.errors import ClusterError
from sparkfleet.nodes.transport.local import LocalTransport
from tests.fleet.connectx import write_dev, write_port
from tests.unit._captures import vm

VM = netif.parse(vm("netif-ip.txt"))
LO = next(i for i in VM.interfaces if i.loopback)


def _net(*ifaces: tuple[str, str, int]) -> NetFacts:
    """The captured loopback plus interfaces (name, address, MTU) shaped like the capture's eth0."""
    eth = next(i for i in VM.interfaces if i.name == "eth0")
    made = tuple(replace(eth, name=n, ipv4=(ip,), prefixes=(24,), mtu=mtu) for n, ip, mtu in ifaces)
    return NetFacts(interfaces=(LO, *made), addresses_known=True)


def _rdma(tmp: Path, ports: list[tuple[str, str | None, tuple[str, ...], str]]) -> rdma.RdmaFacts:
    sys_root, dev_root = tmp / "sys", tmp / "dev"
    for hca, netdev, addrs, state in ports:
        write_port(sys_root, hca, netdev, addrs, state=state)
    write_dev(dev_root, len(ports))
    return rdma.parse(LocalTransport().run(rdma.command(str(sys_root), str(dev_root))).stdout)


def _spark(tmp: Path, ip: str, fabric_if: str = "enp1s0f0np0") -> tuple[NetFacts, rdma.RdmaFacts]:
    net = _net(("enP7s7", ip.replace("192.168.200", "10.0.0"), 1500), (fabric_if, ip, 9000))
    hca = "rocep1s0f1" if fabric_if.endswith("np1") else "rocep1s0f0"
    twin = hca.replace("rocep1", "roceP2p1")
    twin_if = fabric_if.replace("enp1", "enP2p1")
    facts = _rdma(tmp, [(hca, fabric_if, (ip,), "4: ACTIVE"), (twin, twin_if, (), "4: ACTIVE")])
    return net, facts


def _node_facts(name: str, net: NetFacts, r: rdma.RdmaFacts) -> NodeFacts:
    return NodeFacts(node=name, reachable=True, user="root", net=net, rdma=r)


def _checks(target: NodeTarget, facts: NodeFacts) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for c in evaluate(DoctorSpec(nodes=(target,)), {target.name: facts}):
        out.setdefault(c.id, []).append((c.status, c.evidence))
    return out


def test_nccl_selection_syntax_prefix_exact_and_exclude() -> None:
    assert Selection.parse("enp1").selects("enp1s0f0np0")
    assert not Selection.parse("=enp1").selects("enp1s0f0np0")
    assert Selection.parse("=enp1s0f0np0,eth0").selects("eth0")
    ex = Selection.parse("^docker,lo")
    assert not ex.selects("docker0") and ex.selects("enp1s0f0np0")
    assert Selection.parse("^=enP7s7").exact


def test_socket_interfaces_gloo_and_an_exclude_list_that_keeps_the_fabric(tmp_path: Path) -> None:
    net, r = _spark(tmp_path, "192.168.200.12", "enp1s0f1np1")
    env = (("NCCL_SOCKET_IFNAME", "^docker,lo", "recipe"), ("GLOO_SOCKET_IFNAME", "enp1s0f1np1,enP7s7", "recipe"))
    t = NodeTarget(name="b", fabric_ip="192.168.200.12", env=env)
    got = _checks(t, _node_facts("b", net, r))["net.socket_ifname"]
    # NCCL would use the management interface too; Gloo round-robins over both: warnings, not failures
    assert [s for s, _ in got] == ["warn", "warn"]
    assert "enP7s7 not on the fabric" in got[0][1] and "enP7s7 not on the fabric" in got[1][1]
    only_mgmt = replace(t, env=(("NCCL_SOCKET_IFNAME", "=enP7s7", "cluster"),))
    status, evidence = _checks(only_mgmt, _node_facts("b", net, r))["net.socket_ifname"][0]
    assert status == "fail" and "selects enP7s7 on b, none holds the fabric address 192.168.200.12" in evidence


def test_a_down_hca_and_a_link_local_gid_index_fail_with_the_right_index(tmp_path: Path) -> None:
    net = _net(("enp1s0f0np0", "192.168.200.11", 9000))
    r = _rdma(tmp_path, [("rocep1s0f0", "enp1s0f0np0", ("192.168.200.11",), "4: ACTIVE"),
                         ("rocep1s0f1", "enp1s0f1np1", (), "1: DOWN")])  # fmt: skip
    env = (("NCCL_IB_HCA", "=rocep1s0f0,rocep1s0f1", "recipe"), ("NCCL_IB_GID_INDEX", "1", "cluster"))
    t = NodeTarget(name="a", fabric_ip="192.168.200.11", rdma=True, rdma_required=True, env=env)
    got = _checks(t, _node_facts("a", net, r))
    down = "NCCL_IB_HCA==rocep1s0f0,rocep1s0f1 (recipe): not ACTIVE: rocep1s0f1/1 1: DOWN"
    assert got["rdma.hca"] == [("fail", down)]
    status, evidence = got["rdma.gid_index"][0]
    assert status == "fail" and "rocep1s0f0/1 GID 1: RoCE v2 fe80:" in evidence


def test_an_engine_told_the_management_address_fails_naming_the_key(tmp_path: Path) -> None:
    net, r = _spark(tmp_path, "192.168.200.12")
    t = NodeTarget(name="b", fabric_ip="192.168.200.12", env=(("SGLANG_HOST_IP", "10.0.0.12", "recipe"),),
                   argv=("python3", "--dist-init-addr", "10.0.0.11:20000"))  # fmt: skip
    head = NodeTarget(name="a", fabric_ip="192.168.200.11", head=True)
    facts = {"a": _node_facts("a", *_spark(tmp_path / "a", "192.168.200.11")), "b": _node_facts("b", net, r)}
    fails = {(c.id, c.evidence) for c in evaluate(DoctorSpec(nodes=(head, t)), facts) if c.status == "fail"}
    assert ("net.advertise", "SGLANG_HOST_IP=10.0.0.12 (recipe) is not a fabric address: b's own is "
            "192.168.200.12 (10.0.0.12 is on enP7s7)") in fails  # fmt: skip
    assert ("net.advertise", "--dist-init-addr 10.0.0.11:20000 is not a fabric address: the head's is "
            "192.168.200.11") in fails  # fmt: skip


def _found(tmp: Path, host: str, ip: str, fabric_if: str = "enp1s0f0np0", ssh: str | None = None) -> Found:
    net, r = _spark(tmp / host, ip, fabric_if)
    return Found(host=host, hostname="spark", ssh_address=ssh, user="root", net=net, rdma=r, gpus=1,
                 memlock="unlimited")  # fmt: skip


def test_init_takes_the_roce_network_and_lists_both_twins(tmp_path: Path) -> None:
    nodes = [_found(tmp_path, "10.0.0.11", "192.168.200.11", ssh="10.0.0.11"),
             _found(tmp_path, "10.0.0.12", "192.168.200.12", "enp1s0f1np1", ssh="10.0.0.12")]  # fmt: skip
    choices = choose(nodes)
    assert [c.name for c in choices] == ["node1", "node2"]  # same host names, SSH names are addresses
    assert [(c.address.iface.name, c.gid_index) for c in choices] == [("enp1s0f0np0", 3), ("enp1s0f1np1", 3)]
    assert [hca_list(c) for c in choices] == ["rocep1s0f0,roceP2p1s0f0", "rocep1s0f1,roceP2p1s0f1"]
    text = cluster_toml("spark2", choices, ["10.0.0.11", "10.0.0.12"], {"ssh_port": 22})
    assert 'fabric_ifname = "enp1s0f1np1"' in text and "# not the fabric: enP7s7 10.0.0.12/24" in text


def test_init_stops_on_two_addresses_in_the_fabric_and_ifname_picks(tmp_path: Path) -> None:
    a = _found(tmp_path, "a", "192.168.200.11")
    b = _found(tmp_path, "b", "192.168.200.12")
    # node b: a second interface in the fabric subnet, neither carried by RoCE
    eth9 = replace(b.net.interfaces[-1], name="eth9", ipv4=("192.168.200.99",))
    b = replace(b, rdma=rdma.RdmaFacts((), (), {}), net=NetFacts((*b.net.interfaces, eth9), True))
    a = replace(a, rdma=rdma.RdmaFacts((), (), {}))
    with pytest.raises(ClusterError) as err:
        choose([a, b], "192.168.200.0/24")
    listing = "b has several addresses in 192.168.200.0/24: enp1s0f0np0 192.168.200.12, eth9 192.168.200.99"
    assert listing in str(err.value)
    assert "--ifname b=IFNAME" in str(err.value)
    picked = choose([a, b], "192.168.200.0/24", {"b": "eth9"})
    assert picked[1].address.ip == "192.168.200.99"
    with pytest.raises(ClusterError, match="not a network every node is on"):
        choose([a, b], "172.16.0.0/16")


def test_no_common_network_names_every_node_address(tmp_path: Path) -> None:
    a = _found(tmp_path, "a", "192.168.200.11")
    b = replace(_found(tmp_path, "b", "192.168.201.12"), net=_net(("eth0", "172.16.5.5", 1500)))
    with pytest.raises(ClusterError, match=r"no IPv4 network holds an address of every node .*b: eth0 172.16.5.5/24"):
        choose([a, b])
