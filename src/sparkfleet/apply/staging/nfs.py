"""``nfs`` staging: export a folder read-only from one node (an ``/etc/exports.d`` file and
``exportfs -ra``) and mount it on the others as a Docker NFS volume, the way the seed's ``share``
does. Docker mounts the share only when a container first uses the volume, so a wrong address or
a missing export would show at launch: every worker reads ``check_file`` from a container first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from sparkfleet.apply.staging.base import Context, Runner
from sparkfleet.errors import StagingError
from sparkfleet.nodes import files, nfs
from sparkfleet.nodes.runtime import docker
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.staging import StagingStep
from sparkfleet.plan.staging.nfs import Nfs, exports_line, volume_name, volume_opts


@dataclass(frozen=True)
class NfsReport:
    """What an nfs step did on one node."""

    node: str
    role: str  # server | client
    volume: str
    detail: str


def export(server: Transport, path: str, clients: Sequence[str], volume: str) -> NfsReport:
    """Export path read-only from the server node to clients; reload the kernel's export table."""
    if not files.is_dir(server, path):
        raise StagingError(server.node, f"cannot export {path}: no such folder on the NFS server node")
    if not nfs.has_exportfs(server):
        why = "no NFS server here (exportfs not found): install nfs-kernel-server on this node"
        raise StagingError(server.node, why)
    # exportfs only edits the export table; without nfsd threads nothing answers the clients.
    threads = nfs.nfsd_threads(server)
    if not threads:
        why = "no nfsd threads" if threads == 0 else "/proc/fs/nfsd is not mounted: no kernel NFS server"
        why = f"cannot export {path}: the NFS server is not running ({why}); start nfs-kernel-server"
        raise StagingError(server.node, why)
    write = nfs.write_exports(server, volume, exports_line(path, clients, volume))
    if not write.ok:
        target = f"{nfs.EXPORTS_DIR}/{volume}.exports"
        raise StagingError(server.node, f"cannot write {target} (needs root or sudo -n): {write.tail()}")
    reload, listed = nfs.reload_exports(server)
    if not reload.ok or path not in listed.stdout:
        detail = (reload.tail() or listed.tail() or "the export is not listed by exportfs -v").strip()
        raise StagingError(server.node, f"exporting {path} over NFS failed: {detail}")
    return NfsReport(server.node, "server", volume, f"exported {path} to {', '.join(clients)}")


def ensure_volume(client: Transport, volume: str, server_ip: str, path: str, options: str | None) -> NfsReport:
    """Create (or recreate, when its options changed) the worker's NFS volume."""
    wanted = volume_opts(server_ip, path, options)
    seen = docker.volume_options(client, volume)
    if seen is not None:
        if all(seen.get(k) == v for k, v in wanted):
            return NfsReport(client.node, "client", volume, "volume already points at the export")
        removed = docker.remove_volume(client, volume)
        if not removed.ok:
            why = f"volume {volume} points elsewhere and cannot be replaced: {removed.tail()}"
            raise StagingError(client.node, why)
    made = docker.create_volume(client, volume, wanted)
    if not made.ok:
        raise StagingError(client.node, f"docker volume create {volume} failed: {made.tail()}")
    return NfsReport(client.node, "client", volume, f"volume {volume} → {server_ip}:{path}")


def check_volume(client: Transport, volume: str, image: str, check_file: str) -> None:
    """Read check_file through the volume from a container on the node; a StagingError if not."""
    inside = f"/sparkfleet-nfs/{check_file.lstrip('/')}"
    result = docker.run_once(client, image, "head", ["-c", "1", inside], volumes=[(volume, "/sparkfleet-nfs:ro")])
    if not result.ok:
        why = f"cannot read {check_file} through NFS volume {volume} from a container: {result.tail()}"
        raise StagingError(client.node, why)


def run(ctx: Context, steps: Sequence[StagingStep]) -> list[NfsReport]:
    """Export from the server node, then make (and check) every other node's volume at once."""
    entry, plan = steps[0].entry, ctx.plan
    assert isinstance(entry, Nfs) and plan is not None
    nodes = ctx.nodes()
    server = entry.server_node or plan.head.node.name
    path = next(s.src for s in steps if s.node == server)
    assert path is not None
    volume = volume_name(plan.name, entry.id)
    clients = [s.node for s in steps if s.node != server]
    reports = [export(ctx.transport(server), path, [nodes[c].fabric_ip for c in clients], volume)]

    def client(node: str) -> NfsReport:
        report = ensure_volume(ctx.transport(node), volume, nodes[server].fabric_ip, path, entry.options)
        if plan.head.image:
            check_volume(ctx.transport(node), volume, plan.head.image, entry.check_file or "config.json")
        return report

    return reports + ctx.parallel({c: partial(client, c) for c in clients})


RUNNER = Runner(Nfs, "distribute", run)
