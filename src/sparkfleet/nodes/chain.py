"""The commands of a pipeline copy (apply/staging/pipeline.py): ``tar -c`` on a source node piped
down a chain of nodes over SSH, each ``tee``-ing the stream to the next while ``tar -x`` unpacks
it. Each node's ``tar --checkpoint`` line (``sparkfleet-hop I RECORDS``) comes back up the chain
to the source's output: per-node progress.
"""

from __future__ import annotations

import re
import shlex
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sparkfleet.nodes import files as node_files
from sparkfleet.nodes.transport.base import Stream, Transport

RECORD = 10240  # tar's default record: 20 blocks of 512 bytes
CHECKPOINT = 100  # records between progress lines (about 1 MB)
PROGRESS = re.compile(r"sparkfleet-hop (\d+) (\d+)")


@dataclass(frozen=True)
class Hop:
    """One node of the chain: its transport, the folder to unpack into, its fabric address."""

    transport: Transport
    path: str
    address: str | None


def _untar(index: int, dst: str) -> str:
    action = f"echo=sparkfleet-hop {index} %u"
    return f"tar -C {shlex.quote(dst)} -xpf - --checkpoint={CHECKPOINT} --checkpoint-action={shlex.quote(action)}"


def ssh_to(forwarder: Transport, target: Transport, address: str | None) -> str | None:
    """The ssh command forwarder runs to reach target over the fabric (as rsync's node-to-node
    push does); None when target is not reached over SSH."""
    words = target.capabilities.ssh
    if words is None:
        return None
    return f"{node_files.node_side_ssh(forwarder, words)} {shlex.quote(address or words[-1])}"


def _hop(chain: Sequence[Hop], ssh: Sequence[str], scripts: Sequence[str], i: int) -> str:
    """The bash script chain[i] runs (from scripts[i]): unpack what arrives, forward it to
    chain[i + 1] by running that node's script. One file per node, not the rest of the chain
    quoted into one command: quoting a script inside a script doubles it at every node."""
    mkdir = f"mkdir -p {shlex.quote(chain[i].path)}"
    head = f'trap \'rm -rf "$0" ${{d:+"$d"}}\' EXIT; set -o pipefail; {mkdir} || exit 1\n'
    if i == len(chain) - 1:
        return head + _untar(i, chain[i].path) + "\n"
    return head + (
        'd=$(mktemp -d) && mkfifo "$d/f" || exit 1\n'
        f'{ssh[i + 1]} {shlex.quote("bash " + scripts[i + 1])} < "$d/f" & p=$!\n'
        f'tee "$d/f" | {_untar(i, chain[i].path)}; rc=$?\n'
        "wait $p; fw=$?\n"
        '[ "$rc" = 0 ] || exit "$rc"; exit "$fw"\n'
    )


def start(source: Transport, folder: str, chain: Sequence[Hop], ssh: Sequence[str], files: Sequence[str],
          scripts: Sequence[str]) -> Stream:  # fmt: skip
    """Start the chain: a tar of files (relative to folder on source) to chain[0] through ssh[0],
    and on down (ssh[i]: what the node before chain[i] runs to reach it). Its output carries every
    node's progress and errors, its exit code the first failure. Each script removes itself when
    it ends (``remove_scripts`` after the stream, for one that never started)."""
    for i, hop in enumerate(chain):
        hop.transport.put_bytes(_hop(chain, ssh, scripts, i).encode(), scripts[i], mode=0o700)
    script = (
        f"set -o pipefail; tar -C {shlex.quote(folder)} --null -T - -cf - | "
        f"{ssh[0]} {shlex.quote('bash ' + scripts[0])}"
    )
    stream = source.stream(["bash", "-c", script], stdin=True, merge_stderr=True)
    stream.write(b"\0".join(p.encode() for p in files) + b"\0")
    stream.close_stdin()
    return stream


def script_paths(n: int) -> list[str]:
    """Where each node's script of one chain goes (unique to the chain)."""
    tag = uuid.uuid4().hex[:12]
    return [f"/tmp/sparkfleet-chain-{tag}-{i}.sh" for i in range(n)]


def remove_scripts(chain: Sequence[Hop], scripts: Sequence[str]) -> None:
    """Remove the chain's scripts that are still there (a node whose script never started)."""
    for hop, path in zip(chain, scripts, strict=True):
        hop.transport.run(["rm", "-f", path], check=False, timeout=30)
