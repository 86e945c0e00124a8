"""``nfs``: the folder ``src`` exported read-only from ``server_node`` (the first node when not
set) and mounted at ``dst`` in every docker rank: the folder itself on the server, an NFS volume
(``volume_name``) elsewhere, checked by reading ``check_file`` through it before launch."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from sparkfleet.config.templates import render
from sparkfleet.plan.staging.base import Entry, Planning

if TYPE_CHECKING:
    from sparkfleet.config.cluster import Node


# The seed's worker volume options (files/nfs-share.sh): NFSv4.2, read-only, 8 TCP connections,
# 1 MiB reads, hard mounts with a 60 s retransmit timeout.
DEFAULT_OPTIONS = "nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600"
# The seed's export options; fsid is added per export (overlay and some other filesystems
# cannot be exported without one).
EXPORT_OPTIONS = "ro,sync,no_subtree_check,no_root_squash,insecure"


def mount_options(server_ip: str, options: str | None) -> str:
    """The ``o=`` value: the server address, then the step's options (or the seed's); read-only
    is forced, since ranks must never write into the shared checkpoint."""
    opts = [o for o in (options or DEFAULT_OPTIONS).split(",") if o and not o.startswith("addr=")]
    if "ro" not in opts:
        opts = [o for o in opts if o != "rw"] + ["ro"]
    return ",".join([f"addr={server_ip}", *opts])


def volume_opts(server_ip: str, path: str, options: str | None) -> list[tuple[str, str]]:
    """The local driver's options that make a volume the NFS share path of server_ip."""
    return [("type", "nfs"), ("o", mount_options(server_ip, options)), ("device", f":{path}")]


def exports_line(path: str, clients: Sequence[str], volume: str) -> str:
    """One /etc/exports line giving every client read-only access to path."""
    fsid = zlib.crc32(volume.encode()) % 2_000_000_000 + 1
    return f"{path} " + " ".join(f"{c}({EXPORT_OPTIONS},fsid={fsid})" for c in clients) + "\n"


def volume_name(deployment: str, step_id: str) -> str:
    """The Docker volume a deployment's nfs step creates on every worker."""
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", f"sparkfleet-{deployment}-{step_id}").strip("-.")


class Nfs(Entry):
    kind: Literal["nfs"] = "nfs"
    server_node: str | None = None
    options: str | None = None  # the volume's mount options (DEFAULT_OPTIONS when not set)
    check_file: str | None = None

    def problem(self) -> str | None:
        return None if self.src else "kind = 'nfs' needs src (the folder to export)"

    def named_nodes(self) -> dict[str, str]:
        return {"server_node": self.server_node} if self.server_node else {}

    def server(self, at: Planning) -> Node:
        return next((n for n in at.nodes if n.name == self.server_node), at.nodes[0])

    def mount(self, at: Planning, node: Node) -> tuple[str, str] | None:
        server = self.server(at)
        assert self.src is not None
        on_server = render(self.src, at.values(at.rank_of(server.name)))
        return (on_server if node.name == server.name else volume_name(at.deployment, self.id)), self.dst
