"""``nfs``: the folder ``src`` exported read-only from ``server_node`` (the first node when not
set) and mounted at ``dst`` in every docker rank: the folder itself on the server, an NFS volume
(``volume_name``) elsewhere, checked by reading ``check_file`` through it before launch."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from sparkfleet.config.templates import render
from sparkfleet.plan.staging.base import Entry, Planning

if TYPE_CHECKING:
    from sparkfleet.config.cluster import Node


def volume_name(deployment: str, step_id: str) -> str:
    """The Docker volume a deployment's nfs step creates on every worker."""
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", f"sparkfleet-{deployment}-{step_id}").strip("-.")


class Nfs(Entry):
    kind: Literal["nfs"] = "nfs"
    server_node: str | None = None
    options: str | None = None  # the volume's mount options (nfs.DEFAULT_OPTIONS when not set)
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
