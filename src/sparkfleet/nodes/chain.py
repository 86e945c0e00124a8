"""The commands of a pipeline copy (apply/staging/pipeline.py): a tar stream from a source node
down a chain of nodes over SSH, each writing it while forwarding it to the next.

Stock tools only: ``tar -c`` on the source piped into ``ssh`` to the first node, where ``tee``
writes the stream into a FIFO read by ``ssh`` to the next node while ``tar -x`` unpacks it; the
last node only unpacks. Each node's ``tar --checkpoint`` prints ``sparkfleet-hop I RECORDS`` on
stderr, which comes back up the chain to the source's output: per-node progress.
"""

from __future__ import annotations

import re
import shlex
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
    candidates = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-F", "-i")]
    present = node_files.readable(forwarder, candidates)
    return f"{node_files.node_side_ssh(words, present)} {shlex.quote(address or words[-1])}"


def _hop(chain: Sequence[Hop], ssh: Sequence[str], i: int) -> str:
    """The bash script chain[i] runs: unpack what arrives, forward it to chain[i + 1]."""
    mkdir = f"mkdir -p {shlex.quote(chain[i].path)}"
    if i == len(chain) - 1:
        return f"set -o pipefail; {mkdir} && {_untar(i, chain[i].path)}"
    remote = shlex.quote("bash -c " + shlex.quote(_hop(chain, ssh, i + 1)))
    return (
        f'set -o pipefail; {mkdir} && d=$(mktemp -d) && mkfifo "$d/f" || exit 1; '
        f'{ssh[i + 1]} {remote} < "$d/f" & p=$!; '
        f'tee "$d/f" | {_untar(i, chain[i].path)}; rc=$?; wait $p; fw=$?; rm -rf "$d"; '
        '[ "$rc" = 0 ] || exit "$rc"; exit "$fw"'
    )


def start(source: Transport, folder: str, chain: Sequence[Hop], ssh: Sequence[str], files: Sequence[str]) -> Stream:
    """Start the chain: tar of files (relative to folder on source) to chain[0] through ssh[0],
    and on down; ssh[i] is what the node before chain[i] runs to reach it. Its output carries
    every node's progress lines and errors; its exit code the first failure."""
    first = shlex.quote("bash -c " + shlex.quote(_hop(chain, ssh, 0)))
    script = f"set -o pipefail; tar -C {shlex.quote(folder)} --null -T - -cf - | {ssh[0]} {first}"
    stream = source.stream(["bash", "-c", script], stdin=True, merge_stderr=True)
    stream.write(b"\0".join(p.encode() for p in files) + b"\0")
    stream.close_stdin()
    return stream
