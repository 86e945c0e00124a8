"""Pipeline fan-out: the source sends a snapshot once, each node writes it and forwards it to the next.

Push (``sync_node`` to every target at once) shares the source's link among N targets, so with
the link as the limit N targets take about N times one copy. In a chain every link carries the
stream once in and once out, so N targets take about the time of one.

Stock tools only: ``tar -c`` on the source piped into ``ssh`` to the first target, where ``tee``
writes the stream into a FIFO read by ``ssh`` to the next target while ``tar -x`` unpacks it, and
so on to the last. GNU tar's checkpoints (``--checkpoint-action=echo``) on every node report the
records each has unpacked, which come back on the source's stderr: per-node progress.

Resumable per file: every target is listed first (size, mtime, link target, as the tar fallback
of ``sync`` does); only files some target lacks or holds differently travel, so a cut run resends
the files it had not finished. The identity check after it is distribution's, as for push.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Sequence

from sparkfleet.apply.staging.snapshot_identity import Snapshot
from sparkfleet.apply.staging.sync import Endpoint, SyncReport, _prepare, _ssh_words, _stat, transfer_list
from sparkfleet.errors import StagingError
from sparkfleet.nodes import files as node_files
from sparkfleet.nodes.fanout import fan_out

NodeBytesFn = Callable[[str, int], None]
RECORD = 10240  # tar's default record: 20 blocks of 512 bytes
CHECKPOINT = 100  # records between progress lines (about 1 MB)
_PROGRESS = re.compile(r"sparkfleet-hop (\d+) (\d+)")


def _untar(index: int, dst: str) -> str:
    action = f"echo=sparkfleet-hop {index} %u"
    return f"tar -C {shlex.quote(dst)} -xpf - --checkpoint={CHECKPOINT} --checkpoint-action={shlex.quote(action)}"


def _ssh_to(forwarder: Endpoint, target: Endpoint) -> str:
    """The ssh command forwarder runs to reach target over the fabric (as rsync's push does)."""
    words = _ssh_words(target.transport)
    if words is None:
        raise StagingError(target.node, "a pipeline needs an SSH transport to this node")
    candidates = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-F", "-i")]
    present = node_files.readable(forwarder.transport, candidates)
    address = target.address or words[-1]
    return f"{node_files.node_side_ssh(words, present)} {shlex.quote(address)}"


def _hop(chain: Sequence[Endpoint], hops: Sequence[str], i: int) -> str:
    """The bash script node chain[i] runs: unpack what arrives, forward it to chain[i + 1]."""
    target = chain[i]
    mkdir = f"mkdir -p {shlex.quote(target.path)}"
    if i == len(chain) - 1:
        return f"set -o pipefail; {mkdir} && {_untar(i, target.path)}"
    remote = shlex.quote("bash -c " + shlex.quote(_hop(chain, hops, i + 1)))
    return (
        f'set -o pipefail; {mkdir} && d=$(mktemp -d) && mkfifo "$d/f" || exit 1; '
        f'{hops[i + 1]} {remote} < "$d/f" & p=$!; '
        f'tee "$d/f" | {_untar(i, target.path)}; rc=$?; wait $p; fw=$?; rm -rf "$d"; '
        '[ "$rc" = 0 ] || exit "$rc"; exit "$fw"'
    )


def pipeline(
    source: Endpoint,
    targets: Sequence[Endpoint],
    snapshot: Snapshot,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    on_bytes: NodeBytesFn | None = None,
) -> list[SyncReport]:
    """Bring every target's copy up to date with source's through one chain; one report per target."""
    start = time.monotonic()
    files, total = transfer_list(snapshot, include, exclude)
    fan_out([t.node for t in targets], lambda n: _prepare(next(t for t in targets if t.node == n))).raise_all(
        StagingError
    )
    want = _stat(source, files)
    missing = [p for p in files if p not in want]
    if missing:
        raise StagingError(source.node, f"{source.path}: {missing[0]} vanished during the sync")
    by_node = {t.node: t for t in targets}
    have = fan_out(list(by_node), lambda n: _stat(by_node[n], files)).raise_all(StagingError)
    needs = {n: [p for p in files if have[n].get(p) != want[p]] for n in by_node}
    chain = [t for t in targets if needs[t.node]]
    todo = [p for p in files if any(p in needs[t.node] for t in chain)]
    payload = sum(want[p][0] for p in todo if want[p][2] is None)
    if chain:
        _run_chain(source, chain, todo, payload, on_bytes)
    took = time.monotonic() - start
    sent = {t.node: (len(todo), payload) for t in chain}
    return [
        SyncReport(
            t.node, "pipeline", len(files), sent.get(t.node, (0, 0))[0], total, sent.get(t.node, (0, 0))[1], took
        )
        for t in targets
    ]


def _run_chain(source: Endpoint, chain: list[Endpoint], todo: list[str], payload: int,
               on_bytes: NodeBytesFn | None) -> None:  # fmt: skip
    hops = [_ssh_to(source, chain[0])] + [_ssh_to(chain[i - 1], chain[i]) for i in range(1, len(chain))]
    first = shlex.quote("bash -c " + shlex.quote(_hop(chain, hops, 0)))
    script = f"set -o pipefail; tar -C {shlex.quote(source.path)} --null -T - -cf - | {hops[0]} {first}"
    stream = source.transport.stream(["bash", "-c", script], stdin=True, merge_stderr=True)
    with stream:
        stream.write(b"\0".join(p.encode() for p in todo) + b"\0")
        stream.close_stdin()
        said: list[str] = []
        for line in stream:
            m = _PROGRESS.search(line)
            if m is None:
                said.append(line.rstrip())
            elif on_bytes is not None:
                on_bytes(chain[int(m.group(1))].node, min(int(m.group(2)) * RECORD, payload))
        code = stream.wait()
    if code != 0:
        tail = "\n".join(said[-6:]) or "no output"
        raise StagingError(
            chain[0].node,
            f"pipeline {source.node} → {' → '.join(t.node for t in chain)} exited {code}: {tail}\n"
            "Run again to resend only the files that did not arrive, or use --method push",
        )
    if on_bytes is not None:
        for t in chain:
            on_bytes(t.node, payload)
