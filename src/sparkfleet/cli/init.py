"""``sparkfleet init HOST…``: discover every node's fabric over SSH and write cluster.toml."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from sparkfleet.cli.console import console
from sparkfleet.cli.options import AcceptNewOpt, NodeTimeoutOpt
from sparkfleet.errors import ClusterError


def _pairs(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        node, sep, ifname = item.partition("=")
        if not sep or not node or not ifname:
            raise ClusterError(f"--ifname {item!r}: expected NODE=IFNAME")
        out[node] = ifname
    return out


def init(
    hosts: Annotated[list[str], typer.Argument(help="The nodes' SSH addresses, head first (rank order).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the cluster file.")] = Path("cluster.toml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite the output file if it exists.")] = False,
    name: Annotated[str | None, typer.Option("--name", help="The cluster's name (default: the file's stem).")] = None,
    user: Annotated[str | None, typer.Option("--user", help="SSH user (default: ssh's own choice).")] = None,
    ssh_port: Annotated[int | None, typer.Option("--ssh-port", help="SSH port.")] = None,
    ssh_key: Annotated[str | None, typer.Option("--ssh-key", help="SSH private key.")] = None,
    ssh_config: Annotated[str | None, typer.Option("--ssh-config", help="An ssh_config file (ssh -F).")] = None,
    fabric_subnet: Annotated[str | None, typer.Option(help="The fabric network, when several could be (CIDR).")] = None,
    ifname: Annotated[
        list[str] | None,
        typer.Option("--ifname", help="NODE=IFNAME: the fabric interface of a node with several in the subnet."),
    ] = None,
    timeout: NodeTimeoutOpt = 20.0,
    accept_new: AcceptNewOpt = False,
) -> None:
    """Ask every node (in parallel, over SSH) for its interfaces, RDMA ports and GIDs; pick the
    fabric on the network all of them share; write a commented cluster file. Stops with the
    candidates when the choice is not clear."""
    from sparkfleet.config.cluster import load_cluster
    from sparkfleet.doctor.discovery import choose, cluster_toml, discover, hca_list

    if len(set(hosts)) != len(hosts):
        raise ClusterError(f"init: a host is given twice ({', '.join(hosts)})")
    if out.exists() and not force:
        raise ClusterError(f"{out}: exists; pass --force to overwrite it")
    ifnames = _pairs(ifname)
    ssh = {"ssh_port": ssh_port, "ssh_key": ssh_key, "ssh_config": ssh_config}
    choices = choose(discover(hosts, ssh, user, accept_new=accept_new, timeout=timeout), fabric_subnet, ifnames)
    text = cluster_toml(name or out.stem, choices, hosts, ssh)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    load_cluster(out)  # what was written must load: a bug here is not the user's to find later
    for c in choices:
        a = c.address
        hca = hca_list(c) or "no RoCE"
        gid = f"GID {c.gid_index}" if c.gid_index is not None else ""
        console.print(escape(f"{c.name:<10} {c.found.host:<16} {a.ip:<16} {a.iface.name:<14} MTU {a.iface.mtu:<6} "
                             f"{hca} {gid}"), highlight=False, soft_wrap=True)  # fmt: skip
    console.print(f"[green]wrote[/] {escape(str(out))}: {len(choices)} node(s), fabric {choices[0].address.network}")


COMMANDS = {"init": init}
