"""The doctor's checks: fixed ids, pass/warn/fail, the evidence seen and a one-line fix.

`evaluate` is a pure function of the facts gathered on every node (sparkfleet.doctor.probes.facts),
so each check is tested on captured outputs. Check ids (per node unless marked fleet-wide):

    ssh.reachable  docker.version  docker.gpus  docker.memlock  gpu.present  gpu.idle  rdma.devices
    disk.staging_free  mem.available  mem.gpu_free  mem.plan  image.same_id (fleet)
    model.snapshot_same (fleet)  ports.free  clock.skew  probe.output
    and the network's (sparkfleet.doctor.fabric): fabric.reachable  fabric.mtu  net.socket_ifname
    net.advertise  rdma.hca  rdma.gid_index
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sparkfleet.doctor import fabric
from sparkfleet.doctor.probes.facts import NodeFacts
from sparkfleet.doctor.targets import FLEET, Check, DoctorSpec, NodeTarget, Status
from sparkfleet.plan.memory import MIB, MemoryPlan, gb

CLOCK_WARN_S = 1.0
CLOCK_FAIL_S = 30.0

MemoryFn = Callable[[NodeTarget, Mapping[str, NodeFacts]], MemoryPlan | None]


def _check_ssh(t: NodeTarget, f: NodeFacts) -> Check:
    if not f.reachable:
        return Check(
            "ssh.reachable",
            t.name,
            "fail",
            f.error or "no answer",
            "start sshd on the node and check host, port, user and key in the cluster file",
        )
    if t.user and f.user and f.user != t.user:
        return Check(
            "ssh.reachable",
            t.name,
            "fail",
            f"logged in as {f.user!r}, cluster says {t.user!r}",
            "fix `user` for this node in the cluster file",
        )
    return Check("ssh.reachable", t.name, "pass", f"user {f.user}, probes answered in {f.elapsed:.2f} s")


def _check_docker(spec: DoctorSpec, t: NodeTarget, f: NodeFacts) -> Check:
    d = f.docker
    if d is None:
        return Check("docker.version", t.name, "warn", "docker probe gave no answer")
    if d.reachable:
        return Check("docker.version", t.name, "pass", f"daemon {d.server}, client {d.client}")
    status: Status = "fail" if spec.needs_docker else "warn"
    fix = "install docker (docker.io)" if not d.installed else "start dockerd and let this user reach it"
    return Check("docker.version", t.name, status, d.error, fix)


def _check_docker_settings(spec: DoctorSpec, t: NodeTarget, f: NodeFacts) -> list[Check]:
    """What `docker run` will be given on this node: --gpus and --ulimit memlock."""
    if not spec.needs_docker or f.docker is None or not f.docker.reachable:
        return []
    out = []
    if t.gpus != "none" and f.gpu_hook is False:
        out.append(
            Check(
                "docker.gpus",
                t.name,
                "fail",
                f'gpus = "{t.gpus}", but no nvidia-container-runtime-hook on the PATH: docker refuses --gpus',
                'install nvidia-container-toolkit (then restart dockerd), or set gpus = "none"',
            )
        )
    lim = f.memlock
    if lim is not None and not lim.allows(t.memlock):
        hard = "unlimited" if lim.hard is None else f"{lim.hard} bytes"
        out.append(
            Check(
                "docker.memlock",
                t.name,
                "fail",
                f"cluster memlock = {t.memlock!r}, but {lim.source}'s hard limit is {hard}: "
                "docker refuses the --ulimit",
                f'set memlock = "{lim.hard}" for this node, or raise LimitMEMLOCK for docker.service',
            )
        )
    elif lim is not None and t.memlock not in (None, "", "none"):
        out.append(Check("docker.memlock", t.name, "pass", f"memlock {t.memlock} within {lim.source}'s limit"))
    return out


def _check_gpu(t: NodeTarget, f: NodeFacts) -> list[Check]:
    g = f.gpu
    if g is None:
        return [Check("gpu.present", t.name, "warn", "GPU probe gave no answer")]
    if not g.available or not g.gpus:
        if t.gpus == "none":
            return [Check("gpu.present", t.name, "pass", f'no GPU, and none wanted (gpus = "none"): {g.error}')]
        return [
            Check(
                "gpu.present",
                t.name,
                "fail",
                g.error or "nvidia-smi lists no GPU",
                'install the NVIDIA driver, or set gpus = "none" for a CPU node',
            )
        ]
    first = g.gpus[0]
    mem = f"{first.memory_total_mib} MiB" if first.memory_total_mib is not None else "unified memory"
    out = [Check("gpu.present", t.name, "pass", f"{g.count} × {first.name} ({mem}), driver {first.driver}")]
    if g.processes:
        holders = ", ".join(
            f"{p.pid} {p.name}" + (f" {p.used_mib} MiB" if p.used_mib is not None else "") for p in g.processes
        )
        out.append(
            Check(
                "gpu.idle",
                t.name,
                "warn",
                f"processes hold GPU memory: {holders}",
                "stop them (or account for them) before launch",
            )
        )
    return out


def _check_rdma(t: NodeTarget, f: NodeFacts) -> Check | None:
    r = f.rdma
    if r is None:
        return Check("rdma.devices", t.name, "warn", "RDMA probe gave no answer")
    if not r.capable:
        if not (t.rdma or t.rdma_required):
            return None
        seen = ", ".join(r.dev_nodes) or "nothing"
        ports = ", ".join(f"{p.hca}/{p.port} {p.state}" for p in r.ports) or "no device in /sys/class/infiniband"
        status: Status = "fail" if t.rdma_required else "warn"
        return Check(
            "rdma.devices",
            t.name,
            status,
            f"/dev/infiniband: {seen}; {ports}",
            "load the RDMA driver and bring a port ACTIVE, or set rdma = false and drop NCCL_NET=IB",
        )
    port = r.port_for_ip(t.fabric_ip)
    active = ", ".join(f"{p.hca}/{p.port}" for p in r.ports if p.active)
    if port is None:
        return Check(
            "rdma.devices",
            t.name,
            "warn",
            f"active: {active}; no GID carries {t.fabric_ip}",
            "put the fabric address on a RoCE port's netdev",
        )
    index = port.roce_v2_index(t.fabric_ip)
    # Whether NCCL_IB_GID_INDEX (from the cluster's ib_gid_index or the recipe) names it is rdma.gid_index's.
    evidence = f"{port.hca}/{port.port} {port.state} {port.link_layer}, RoCE v2 GID index {index} for {t.fabric_ip}"
    return Check("rdma.devices", t.name, "pass", evidence)


def _check_disks(t: NodeTarget, f: NodeFacts) -> list[Check]:
    out = []
    free = dict(f.disks)
    for step_id, dst, min_free in t.staging:
        d = free.get(dst)
        if d is None:
            out.append(Check("disk.staging_free", t.name, "warn", f"[{step_id}] {dst}: df gave no answer"))
        elif d.avail < min_free:
            out.append(
                Check(
                    "disk.staging_free",
                    t.name,
                    "fail",
                    f"[{step_id}] {dst}: {gb(d.avail)} free on {d.mount}, needs {gb(min_free)}",
                    f"free space on {d.mount} or point the staging dst elsewhere",
                )
            )
        else:
            out.append(
                Check(
                    "disk.staging_free",
                    t.name,
                    "pass",
                    f"[{step_id}] {dst}: {gb(d.avail)} free on {d.mount} (min {gb(min_free)})",
                )
            )
    return out


def _check_memory(t: NodeTarget, f: NodeFacts, mp: MemoryPlan | None) -> list[Check]:
    out = []
    if f.meminfo is not None:
        need = mp.total_need if mp else None
        unified = f.gpu is None or not f.gpu.gpus or f.gpu.gpus[0].unified_memory
        avail = f.meminfo.available
        ev = f"MemAvailable {gb(avail)} of {gb(f.meminfo.total)}"
        if need is not None and unified and avail < need:
            out.append(
                Check(
                    "mem.available",
                    t.name,
                    "fail",
                    f"{ev}; the memory plan needs {gb(need)}",
                    "stop what holds memory; drop the page cache (sync; echo 3 > /proc/sys/vm/drop_caches)",
                )
            )
        else:
            out.append(Check("mem.available", t.name, "pass", ev + (f"; plan needs {gb(need)}" if need else "")))
    gpus = f.gpu.gpus if f.gpu else ()
    if mp is not None and mp.static_pool and gpus and gpus[0].memory_free_mib is not None:
        # Discrete GPUs: the engine refuses to start when less than its pool is free.
        free = gpus[0].memory_free_mib * MIB
        ev = f"{gpus[0].name}: {gb(free)} free, the static pool needs {gb(mp.static_pool)}"
        if free < mp.static_pool:
            used = ", ".join(f"{p.pid} {p.name}" for p in f.gpu.processes) if f.gpu else ""
            fix = f"stop what holds GPU memory ({used})" if used else "free GPU memory or lower the memory fraction"
            out.append(Check("mem.gpu_free", t.name, "fail", ev, fix))
        else:
            out.append(Check("mem.gpu_free", t.name, "pass", ev))
    if mp is not None:
        if mp.fits is True:
            out.append(Check("mem.plan", t.name, "pass", f"fits; headroom {gb(mp.headroom)}"))
        elif mp.fits is False:
            worst = "static pool" if (mp.pool_headroom or 0) < 0 else "outside the pool"
            out.append(
                Check(
                    "mem.plan",
                    t.name,
                    "fail",
                    f"does not fit ({worst}); headroom {gb(mp.headroom)}",
                    "lower the KV pin or the chunk size, or raise TP (see `sparkfleet plan`)",
                )
            )
        else:
            unknown = ", ".join(i.name for i in mp.items if i.bytes is None) or "device memory"
            out.append(
                Check(
                    "mem.plan",
                    t.name,
                    "warn",
                    f"no verdict: unknown {unknown}",
                    "set [memory] weights_per_rank / kv_bytes_per_token in the recipe",
                )
            )
    return out


def _check_ports(t: NodeTarget, f: NodeFacts) -> list[Check]:
    if f.ports is None or not t.ports:
        return []
    busy = {p: f.ports.holders(p) for p in t.ports if f.ports.holders(p)}
    if not busy:
        return [Check("ports.free", t.name, "pass", "free: " + ", ".join(str(p) for p in t.ports))]
    listing = "; ".join(f"{p} held by {', '.join(h.address for h in hs)}" for p, hs in busy.items())
    return [
        Check(
            "ports.free",
            t.name,
            "fail",
            f"in use: {listing}",
            "stop what listens there (ss -ltnp) or change port/rendezvous_port in the recipe",
        )
    ]


def _check_clock(t: NodeTarget, f: NodeFacts) -> Check | None:
    if f.skew is None:
        return None
    off = abs(f.skew.seconds)
    ev = f"offset {f.skew.seconds:+.3f} s from this machine (±{f.skew.uncertainty:.3f} s)"
    if off > CLOCK_FAIL_S:
        return Check("clock.skew", t.name, "fail", ev, "enable NTP (timedatectl set-ntp true)")
    if off > CLOCK_WARN_S:
        return Check("clock.skew", t.name, "warn", ev, "enable NTP (timedatectl set-ntp true)")
    return Check("clock.skew", t.name, "pass", ev)


def _check_image(spec: DoctorSpec, facts: Mapping[str, NodeFacts]) -> list[Check]:
    if not spec.image:
        return []
    ids = {n.name: facts[n.name].image for n in spec.nodes if facts[n.name].reachable}
    if not ids:
        return []
    missing = [name for name, img in ids.items() if img is None or not img.present]
    present = {name: img.id for name, img in ids.items() if img is not None and img.present}
    if missing:
        return [
            Check(
                "image.same_id",
                FLEET,
                "fail",
                f"{spec.image} missing on {', '.join(missing)}",
                "sparkfleet image build RECIPE (or docker pull on those nodes)",
            )
        ]
    distinct = set(present.values())
    if len(distinct) > 1:
        listing = ", ".join(f"{name} {i[7:19]}" for name, i in present.items())
        return [
            Check(
                "image.same_id",
                FLEET,
                "fail",
                f"{spec.image} differs: {listing}",
                "sparkfleet image push RECIPE to give every node the same image",
            )
        ]
    only = distinct.pop() if distinct else "?"
    return [Check("image.same_id", FLEET, "pass", f"{spec.image} = {only[7:19]} on {len(present)} node(s)")]


def _check_snapshot(spec: DoctorSpec, facts: Mapping[str, NodeFacts]) -> list[Check]:
    if not spec.model_repo:
        return []
    lists = {n.name: facts[n.name].snapshots for n in spec.nodes if facts[n.name].reachable}
    if not lists:
        return []  # no node answered: ssh.reachable already says so
    missing = [name for name, snaps in lists.items() if not snaps]
    if missing:
        return [
            Check(
                "model.snapshot_same",
                FLEET,
                "fail",
                f"{spec.model_repo}: no snapshot on {', '.join(missing)}",
                "sparkfleet stage RECIPE (or hf download on those nodes)",
            )
        ]
    files = {name: frozenset(f for s in snaps or () for f in s.files) for name, snaps in lists.items()}
    reference_node, reference = next(iter(files.items()))
    differing = []
    for name, have in files.items():
        if have != reference:
            extra = sorted(p for p, _ in have - reference)[:3]
            lacking = sorted(p for p, _ in reference - have)[:3]
            differing.append(f"{name} (vs {reference_node}: differs at {', '.join(extra + lacking)})")
    if differing:
        return [
            Check(
                "model.snapshot_same",
                FLEET,
                "fail",
                "; ".join(differing),
                "re-sync the snapshot on those nodes (sparkfleet stage RECIPE)",
            )
        ]
    total = sum(size for _, size in reference)
    return [
        Check(
            "model.snapshot_same",
            FLEET,
            "pass",
            f"{spec.model_repo}: {len(reference)} files, {gb(total)} identical on {len(files)} node(s)",
        )
    ]


def evaluate(
    spec: DoctorSpec,
    facts: Mapping[str, NodeFacts],
    memory: MemoryFn | None = None,
) -> tuple[Check, ...]:
    """Every check from the gathered facts (pure): per node in rank order, then fleet-wide."""
    checks: list[Check] = []
    for t in spec.nodes:
        f = facts[t.name]
        checks.append(_check_ssh(t, f))
        if not f.reachable:
            continue
        checks.append(_check_docker(spec, t, f))
        checks += _check_docker_settings(spec, t, f)
        checks += _check_gpu(t, f)
        rdma_check = _check_rdma(t, f)
        checks += [rdma_check] if rdma_check else []
        checks += _check_disks(t, f)
        checks += _check_memory(t, f, memory(t, facts) if memory else None)
        checks += _check_ports(t, f)
        clock_check = _check_clock(t, f)
        checks += [clock_check] if clock_check else []
        checks += [Check("probe.output", t.name, "warn", e) for e in f.errors]
    checks += fabric.evaluate_network(spec, facts)
    checks += _check_image(spec, facts)
    checks += _check_snapshot(spec, facts)
    return tuple(checks)
