"""doctor's checks as a pure function of node facts parsed from captured real outputs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sparkfleet.doctor.checks import DoctorSpec, NodeTarget, evaluate
from sparkfleet.doctor.probes import docker, gpu, limits, meminfo, netif, rdma, reach
from sparkfleet.doctor.probes.clock import Skew
from sparkfleet.doctor.probes.facts import NodeFacts
from sparkfleet.doctor.probes.reach import Reach
from sparkfleet.doctor.probes.snapshot import Snapshot
from sparkfleet.doctor.run import Report
from sparkfleet.nodes.transport.local import LocalTransport
from sparkfleet.plan.memory import GIB, MemoryInputs, plan_memory
from tests.unit._captures import h200_section, vm
from tests.unit.test_probes_net import _connectx_tree

H200_GPU = gpu.parse(
    h200_section("query-gpu csv", "nvidia-smi-h200.txt"),
    0,
    h200_section("query-compute-apps", "nvidia-smi-h200.txt"),
)
H200_MEM = meminfo.parse(h200_section("meminfo"))
VM_NET = netif.parse(vm("netif-ip.txt"))
DOCKER_UP = docker.parse_version(vm("docker-version.json"), 0)
IMAGE = docker.parse_image("img:1", vm("docker-image-inspect.json"), 0)
SNAP = (Snapshot("rev1", (("config.json", 2), ("model.safetensors", 10))),)


def _facts(name: str, **kw: object) -> NodeFacts:
    base = NodeFacts(
        node=name, reachable=True, user="root", skew=Skew(0.0, 0.05), meminfo=H200_MEM, gpu=H200_GPU,
        rdma=rdma.parse("## dev\nrdma_cm\n## sysfs\n## netdev\n"), net=VM_NET, docker=DOCKER_UP, image=IMAGE,
        snapshots=SNAP,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def _target(name: str, **kw: object) -> NodeTarget:
    return NodeTarget(name=name, fabric_ip="192.0.2.2", user="root", **kw)  # type: ignore[arg-type]


def _by(checks: tuple, status: str) -> dict[tuple[str, str], str]:  # type: ignore[type-arg]
    return {(c.id, c.node): c.evidence for c in checks if c.status == status}


def test_healthy_h200_pair_passes_everything() -> None:
    spec = DoctorSpec(nodes=(_target("a", head=True), _target("b")), image="img:1", model_repo="org/m",
                      needs_docker=True)  # fmt: skip
    head = _facts("a", reach=(Reach("192.0.2.2", 22, True, "connected"),))
    checks = evaluate(spec, {"a": head, "b": _facts("b")})
    assert _by(checks, "fail") == {} and _by(checks, "warn") == {}
    passed = _by(checks, "pass")
    assert "1 × NVIDIA H200 (143771 MiB), driver 580.159.04" in passed[("gpu.present", "a")]
    assert ("image.same_id", "fleet") in passed and ("fabric.mtu", "fleet") in passed
    assert Report(checks, 0.1).to_json()["ok"] is True


def test_rdma_cm_alone_fails_when_the_recipe_needs_ib() -> None:
    spec = DoctorSpec(nodes=(_target("a", head=True, rdma=True, rdma_required=True),))
    fails = _by(evaluate(spec, {"a": _facts("a")}), "fail")
    assert "rdma_cm" in fails[("rdma.devices", "a")]
    soft = DoctorSpec(nodes=(_target("a", head=True, rdma=True),))
    assert ("rdma.devices", "a") in _by(evaluate(soft, {"a": _facts("a")}), "warn")


def test_roce_port_gives_the_gid_index_and_a_wrong_cluster_index_fails(tmp_path: Path) -> None:
    sys_root, dev_root = _connectx_tree(tmp_path)
    facts = rdma.parse(LocalTransport().run(rdma.command(str(sys_root), str(dev_root))).stdout)
    t = NodeTarget(name="a", fabric_ip="192.168.200.11", rdma=True, rdma_required=True, head=True)
    ok = _by(evaluate(DoctorSpec(nodes=(t,)), {"a": _facts("a", rdma=facts)}), "pass")
    assert ok[("rdma.devices", "a")] == "rocep1s0f0/1 4: ACTIVE Ethernet, RoCE v2 GID index 3 for 192.168.200.11"
    wrong = replace(t, env=(("NCCL_IB_GID_INDEX", "1", "cluster"),))
    fails = _by(evaluate(DoctorSpec(nodes=(wrong,)), {"a": _facts("a", rdma=facts)}), "fail")
    assert "NCCL_IB_GID_INDEX=1 (cluster) is not a RoCE v2 GID of 192.168.200.11" in fails[("rdma.gid_index", "a")]


def test_busy_gpu_warns_and_missing_driver_fails() -> None:
    busy = replace(
        H200_GPU,
        processes=gpu.parse_apps("pid, process_name, used_gpu_memory [MiB]\n4242, python3, 70000 MiB\n"),
    )
    spec = DoctorSpec(nodes=(_target("a", head=True), _target("b")))
    checks = evaluate(spec, {"a": _facts("a", gpu=busy), "b": _facts("b", gpu=gpu.parse("", 127))})
    assert "4242 python3 70000 MiB" in _by(checks, "warn")[("gpu.idle", "a")]
    assert _by(checks, "fail")[("gpu.present", "b")] == "nvidia-smi not found"


def test_mtu_mismatch_image_drift_snapshot_drift_and_clock_skew_name_the_nodes() -> None:
    eth = VM_NET.with_address("192.0.2.2")
    assert eth is not None
    small = replace(VM_NET, interfaces=tuple(replace(i, mtu=1500) if i is eth else i for i in VM_NET.interfaces))
    other_image = replace(IMAGE, id="sha256:" + "ab" * 32)
    drift = (Snapshot("rev1", (("config.json", 2), ("model.safetensors", 9))),)
    spec = DoctorSpec(nodes=(_target("a", head=True), _target("b"), _target("c")), image="img:1",
                      model_repo="org/m")  # fmt: skip
    facts = {
        "a": _facts("a"),
        "b": _facts("b", net=small, image=other_image),
        "c": _facts("c", snapshots=drift, skew=Skew(45.0, 0.1)),
    }
    fails = _by(evaluate(spec, facts), "fail")
    assert set(k for k in fails if k[0] == "fabric.mtu") == {("fabric.mtu", "b")}  # the odd one, by name
    assert fails[("fabric.mtu", "b")].startswith("fabric interface eth0 has MTU 1500, the others 1400")
    assert "b abababababab" in fails[("image.same_id", "fleet")]
    assert fails[("model.snapshot_same", "fleet")].startswith("c (vs a: differs at model.safetensors")
    assert "+45.000 s" in fails[("clock.skew", "c")]


def test_unreachable_node_fails_once_and_is_left_out_of_fleet_checks() -> None:
    spec = DoctorSpec(nodes=(_target("a", head=True), _target("b")), image="img:1", model_repo="org/m")
    down = NodeFacts(node="b", reachable=False, error="cannot reach root@10.0.0.2 over SSH: Connection refused")
    checks = evaluate(spec, {"a": _facts("a"), "b": down})
    fails = _by(checks, "fail")
    assert fails == {("ssh.reachable", "b"): "cannot reach root@10.0.0.2 over SSH: Connection refused"}
    assert [c.id for c in checks if c.node == "b"] == ["ssh.reachable"]


def test_memory_plan_verdicts_and_memavailable_on_unified_memory() -> None:
    gb10 = replace(H200_GPU, gpus=(replace(H200_GPU.gpus[0], name="NVIDIA GB10", memory_total_mib=None),))
    tight = replace(H200_MEM, available=100 * GIB)

    def plan(weights: int):  # type: ignore[no-untyped-def]
        return plan_memory(MemoryInputs(
            engine="sglang", argv=("x", "--mem-fraction-static", "0.8", "--max-total-tokens", "8000000"),
            env=(), rank=0, tp=4, nnodes=4, device_memory=int(121.7 * GIB), device_source="test",
            kv_bytes_per_token=1670.75, weights_per_rank=weights, cuda_graph=0))  # fmt: skip

    spec = DoctorSpec(nodes=(_target("a", head=True),))
    ok = evaluate(spec, {"a": _facts("a", gpu=gb10, meminfo=tight)}, lambda t, f: plan(70 * GIB))
    assert ("mem.plan", "a") in _by(ok, "pass")
    assert "the memory plan needs" in _by(ok, "fail")[("mem.available", "a")]  # 100 GiB free < pool + NCCL + head
    bad = evaluate(spec, {"a": _facts("a", gpu=gb10)}, lambda t, f: plan(90 * GIB))
    assert "does not fit (static pool)" in _by(bad, "fail")[("mem.plan", "a")]


def test_docker_refusals_are_caught_before_up() -> None:
    dockerd_limit = limits.parse("## dockerd\n" + vm("dockerd-limits-memlock.txt"))
    assert dockerd_limit.hard == 8388608
    shell_limit = limits.parse("## shell\n" + vm("ulimit-H-l.txt"))
    assert shell_limit.hard == 8192 * 1024
    spec = DoctorSpec(
        nodes=(_target("a", head=True, memlock="unlimited"), _target("b", memlock="8388608", gpus="none")),
        needs_docker=True,
    )
    facts = {
        "a": _facts("a", memlock=dockerd_limit, gpu_hook=False),
        "b": _facts("b", memlock=dockerd_limit, gpu_hook=False),
    }
    checks = evaluate(spec, facts)
    fails = _by(checks, "fail")
    assert "hard limit is 8388608 bytes" in fails[("docker.memlock", "a")]
    assert "docker refuses --gpus" in fails[("docker.gpus", "a")]
    assert ("docker.memlock", "b") in _by(checks, "pass") and ("docker.gpus", "b") not in fails


def test_discrete_gpu_with_too_little_free_memory_for_the_pool_fails() -> None:
    held = gpu.parse_apps("pid, process_name, used_gpu_memory [MiB]\n4242, python3, 70000 MiB\n")
    busy = replace(H200_GPU, gpus=(replace(H200_GPU.gpus[0], memory_free_mib=73000),), processes=held)

    def pool_of(fraction: str):  # type: ignore[no-untyped-def]
        argv = ("vllm", "serve", "--gpu-memory-utilization", fraction)
        inputs = MemoryInputs(engine="vllm", argv=argv, env=(), rank=0, tp=1, nnodes=1,
                              device_memory=143771 * 1024 * 1024, device_source="nvidia-smi",
                              weights_per_rank=GIB)  # fmt: skip
        return lambda t, f: plan_memory(inputs)

    spec = DoctorSpec(nodes=(_target("a", head=True),))
    checks = evaluate(spec, {"a": _facts("a", gpu=busy)}, pool_of("0.9"))
    failed = _by(checks, "fail")[("mem.gpu_free", "a")]
    assert "NVIDIA H200: 76.55 GB" in failed and "needs 135.68 GB" in failed
    assert "4242 python3" in next(c.fix for c in checks if c.id == "mem.gpu_free")
    ok = evaluate(spec, {"a": _facts("a", gpu=busy)}, pool_of("0.4"))
    assert ("mem.gpu_free", "a") in _by(ok, "pass")


def test_reach_without_bash_on_the_head_is_a_warning_not_a_failure() -> None:
    found = reach.parse(
        "", [("192.0.2.2", 22)], 127, "timeout: failed to run command 'bash': No such file or directory\n"
    )
    spec = DoctorSpec(nodes=(_target("a", head=True),))
    checks = evaluate(spec, {"a": _facts("a", reach=found)})
    assert "not tested" in _by(checks, "warn")[("fabric.reachable", "a")]


def test_no_node_answering_gives_one_failure_per_node_and_no_crash() -> None:
    spec = DoctorSpec(nodes=(_target("a", head=True), _target("b")), image="img:1", model_repo="org/m")
    down = {n: NodeFacts(node=n, reachable=False, error="no answer") for n in ("a", "b")}
    fails = _by(evaluate(spec, down), "fail")
    assert fails == {("ssh.reachable", "a"): "no answer", ("ssh.reachable", "b"): "no answer"}
