"""How a ``sync`` copies a Hugging Face snapshot (or any folder) to one node's cache.

What is sent, computed on the source so include/exclude globs match snapshot paths (``original/*``),
never blob hashes: for a hub cache repo the selected files of one revision as the hub lays them out
(``snapshots/<rev>/`` symlinks, the ``blobs/`` they point to, the ``refs/`` naming the revision);
for a plain folder its selected files.

How: rsync ``--files-from`` that list in archive mode, so a second sync is a size+mtime check that
moves no data, and a cut copy resumes from ``.sparkfleet-partial/``. From a source node rsync runs
ON that node and pushes over the fabric, node to node: a laptop controller on Wi-Fi would otherwise
carry 150 GB twice per node. Without rsync on either end, the files that differ are streamed with
tar over SSH through the controller, and the report says so.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparkfleet.apply.staging.base import Method
from sparkfleet.apply.staging.snapshot_identity import Snapshot, select
from sparkfleet.errors import StagingError, TransportError
from sparkfleet.nodes import files as node_files
from sparkfleet.nodes.transport.base import Transport

BytesFn = Callable[[int], None]
_NOT_FOUND = re.compile(r"rsync: (command )?not found|rsync: No such file or directory|exec: rsync:")
_FALLBACK = "rsync is not installed on {}: copied with a tar stream over SSH instead (whole files, no delta)"
_SSH_FAIL = re.compile(
    r"Permission denied|Host key verification failed|Connection (refused|timed out)|"
    r"Could not resolve|No route to host|connection unexpectedly closed"
)


@dataclass(frozen=True)
class Endpoint:
    """Where one side of a copy lives: a path on a node, reached by a transport."""

    transport: Transport
    path: str
    address: str | None = None  # how other nodes reach this one (its fabric IP), to push here

    @property
    def node(self) -> str:
        return self.transport.node

    @property
    def local(self) -> bool:
        return self.transport.capabilities.local


class RsyncMissing(Exception):
    """rsync is not installed on a node (the sync falls back to a tar stream)."""

    def __init__(self, node: str) -> None:
        super().__init__(node)
        self.node = node


@dataclass(frozen=True)
class SyncReport:
    """What one sync did to one node."""

    node: str
    method: str  # rsync | tar | none
    files_total: int
    files_sent: int
    bytes_total: int
    bytes_sent: int  # file data that crossed the wire (rsync's "Literal data")
    seconds: float
    note: str | None = None


def transfer_list(snapshot: Snapshot, include: Sequence[str], exclude: Sequence[str]) -> tuple[list[str], int]:
    """The paths (relative to the source root) one sync sends, and their bytes."""
    kept = select(snapshot.files, include, exclude)
    if not kept:
        raise StagingError(snapshot.node, f"{snapshot.root}: no file matches include/exclude")
    dangling = [f.path for f in kept if f.kind == "dangling"]
    if dangling:
        raise StagingError(snapshot.node, f"{snapshot.root}: broken links in the snapshot: {', '.join(dangling[:5])}")
    if snapshot.layout != "hf":
        return [f.path for f in kept], sum(f.size for f in kept)
    prefix = f"snapshots/{snapshot.revision}/"
    paths = [f"refs/{name}" for name, _ in snapshot.refs]
    blobs: dict[str, int] = {}
    total = 0
    for f in kept:
        paths.append(prefix + f.path)
        if f.kind == "link" and f.blob:
            blobs[f.blob] = f.size
        elif f.kind == "file":
            total += f.size
    paths.extend(sorted(blobs))
    return paths, total + sum(blobs.values())


def _prepare(end: Endpoint) -> None:
    if end.local:
        os.makedirs(end.path, exist_ok=True)
        return
    made = node_files.make_dir(end.transport, end.path)
    if not made.ok:
        raise StagingError(end.node, f"cannot create {end.path}: {made.tail()}")


# What a SyncReport takes from ``rsync --stats``: the files it sent and the data that crossed the wire.
_STAT_FIELDS = {"files_sent": "Number of regular files transferred", "literal": "Literal data"}


def parse_stats(text: str) -> dict[str, int]:
    """The figures of ``rsync --stats`` (missing ones absent)."""
    out: dict[str, int] = {}
    for key, label in _STAT_FIELDS.items():
        if m := re.search(rf"^{re.escape(label)}: ([\d,.]+)", text, re.M):
            out[key] = int(m.group(1).replace(",", "").split(".")[0])
    return out


def _rsync(source: Endpoint, target: Endpoint, names: list[str], on_bytes: BytesFn | None) -> dict[str, int]:
    """Run one rsync from source to target; return its --stats figures."""
    same_node = source.node == target.node
    where = "controller" if source.local else source.node
    if source.local:
        if target.local or same_node:
            argv = node_files.rsync_argv(source.path, target.path, None)
        else:
            words = target.transport.capabilities.ssh  # ending with the host; None: not SSH
            if words is None:
                raise StagingError(target.node, "sync needs an SSH (or local) transport to this node")
            argv = node_files.rsync_argv(source.path, f"{words[-1]}:{target.path}", shlex.join(words[:-1]),
                                         make_dest=target.path)  # fmt: skip
    elif same_node:
        argv = node_files.in_new_folder(target.path, node_files.rsync_argv(source.path, target.path, None))
    else:
        tgt_words = target.transport.capabilities.ssh or ()
        address = target.address or (tgt_words[-1] if tgt_words else target.node)
        ssh = node_files.node_side_ssh(source.transport, tgt_words)
        argv = node_files.rsync_argv(source.path, f"{address}:{target.path}", ssh, make_dest=target.path)
    if source.local and target.local:
        os.makedirs(target.path, exist_ok=True)
    # rsync runs where the source is: here for a controller path, on the source node otherwise.
    try:
        code, out, err = node_files.run_rsync(source.transport, argv, names, on_bytes)
    except TransportError as exc:
        if source.transport.capabilities.local:
            raise StagingError("controller", f"{argv[0]} is not installed on this machine") from exc
        raise StagingError(source.node, exc.detail) from exc
    if code != 0 and _NOT_FOUND.search(err):
        # 127 from the shell that ssh started on the runner: the runner lacks rsync; otherwise the
        # receiving side's shell said so.
        raise RsyncMissing(source.node if (code == 127 and not source.local) else target.node)
    if code != 0:
        raise StagingError(target.node, _rsync_failure(code, err, source, target, where))
    return parse_stats(out)


def _rsync_failure(code: int, err: str, source: Endpoint, target: Endpoint, where: str) -> str:
    tail = "\n".join(err.strip().splitlines()[-6:]) or "no output"
    if "No space left on device" in err:
        return f"disk full while syncing into {target.path}: {tail}"
    if code < 0:
        return f"rsync (on {where}) was killed by signal {-code}; run again to resume from the partial files"
    if where != "controller" and (code == 255 or _SSH_FAIL.search(err)):
        return (f"{source.node} cannot reach {target.node} ({target.address}) over SSH to push the snapshot node to "
                f"node: {tail}\nAuthorise {source.node}'s key on {target.node}, or sync from a path on the controller "
                "(src without source_node)")  # fmt: skip
    return f"rsync from {source.node}:{source.path} (run on {where}) exited {code}: {tail}"


def _stat(end: Endpoint, paths: list[str]) -> dict[str, tuple[int, int, str | None]]:
    """For the tar fallback: {path: (size, mtime, link target or None)} of the paths under end.path."""
    if end.local:
        os.makedirs(end.path, exist_ok=True)
    result = node_files.stat_entries(end.transport, end.path, paths)
    if not result.ok:
        raise StagingError(end.node, f"cannot list {end.path}: {result.tail()}")
    return node_files.parse_stat_entries(result.stdout)


def _source_stat(source: Endpoint, files: list[str]) -> dict[str, tuple[int, int, str | None]]:
    want = _stat(source, files)
    missing = [p for p in files if p not in want]
    if missing:
        raise StagingError(source.node, f"{source.path}: {missing[0]} vanished during the sync")
    return want


def _tar(source: Endpoint, target: Endpoint, files: list[str], on_bytes: BytesFn | None) -> tuple[int, int]:
    """Stream the files whose size, mtime or link differ; return (files sent, bytes sent)."""
    have = _stat(target, files)
    want = _source_stat(source, files)
    todo = [p for p in files if have.get(p) != want[p]]
    if not todo:
        return 0, 0
    payload = sum(want[p][0] for p in todo if want[p][2] is None)
    # Both ends through this machine: tar -c on the source, tar -x on the target, chunk by chunk.
    reader = node_files.tar_out(source.transport, source.path)
    writer = node_files.tar_in(target.transport, target.path)
    reader.write(b"\0".join(p.encode() for p in todo) + b"\0")
    reader.close_stdin()
    moved = 0
    try:
        while chunk := reader.read(1 << 20):
            writer.write(chunk)
            moved += len(chunk)
            if on_bytes is not None:
                on_bytes(min(moved, payload))
    except BrokenPipeError:
        pass
    finally:
        writer.close_stdin()
    rcode, wcode = reader.wait(), writer.wait()
    if rcode != 0 or wcode != 0:
        tail = (reader.errors() + writer.errors()).strip()[-800:]
        raise StagingError(target.node, f"tar stream from {source.node}:{source.path} failed: {tail}")
    return sum(1 for p in todo if want[p][2] is None), payload


def sync_node(source: Endpoint, target: Endpoint, snapshot: Snapshot, *, include: Sequence[str],
              exclude: Sequence[str], method: Method, on_bytes: BytesFn | None) -> SyncReport:  # fmt: skip
    """Bring target's copy of the snapshot up to date with source's; return what moved."""
    start = time.monotonic()
    files, total = transfer_list(snapshot, include, exclude)
    if source.node == target.node and source.path.rstrip("/") == target.path.rstrip("/"):
        return SyncReport(target.node, "none", len(files), 0, total, 0, 0.0, "source and destination are one folder")
    note, use = None, method
    if use == "auto" and source.local and shutil.which("rsync") is None:
        use, note = "tar", _FALLBACK.format(source.node)
    if use in ("auto", "rsync"):
        try:
            stats = _rsync(source, target, files, on_bytes)
            use = "rsync"
        except RsyncMissing as missing:
            if use == "rsync":
                raise StagingError(missing.node, "rsync is not installed on this node") from None
            use, note = "tar", _FALLBACK.format(missing.node)
    if use == "rsync":
        sent_files, sent = stats.get("files_sent", 0), stats.get("literal", 0)
    else:
        _prepare(target)
        sent_files, sent = _tar(source, target, files, on_bytes)
    if on_bytes is not None:
        on_bytes(total)
    return SyncReport(target.node, use, len(files), sent_files, total, sent, time.monotonic() - start, note)
