"""Snapshot identity: is the model every node will load the same model?

A node-side scanner lists one snapshot (a Hugging Face cache repo at one revision, or any folder):
every file's path and size, and the sha256 of the small files that decide how a checkpoint is read
(config, index, tokenizer, chat template). Before launch every node's listing is compared with the
reference and the nodes that differ are refused, naming the files: ranks that load different shards
or configs hang or answer garbage, far from the cause. Hashing only those keeps the check at seconds
for a 150 GB checkpoint; shards are covered by their sizes and, in a hub cache, their blob names.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkfleet.errors import StagingError
from sparkfleet.nodes import files as node_files
from sparkfleet.nodes.ship import SNAPSHOT_SCAN, run_shipped
from sparkfleet.nodes.shipped.snapshot_scan import scan_snapshot
from sparkfleet.nodes.transport.base import Transport

# Small files whose content decides how the checkpoint is read; hashed on every node.
HASHED = ("*.json", "*.jinja", "*.model", "*.txt", "*.py", "*.tiktoken")
HASH_LIMIT = 64 * 1024 * 1024
_SHOWN = 8


@dataclass(frozen=True)
class FileFact:
    """One file of a snapshot, as a node has it."""

    path: str
    kind: str  # file | link | dangling
    size: int
    link: str | None
    blob: str | None
    sha256: str | None


@dataclass(frozen=True)
class Snapshot:
    """One node's copy of a snapshot."""

    node: str
    root: str
    layout: str  # hf | dir
    revision: str | None
    refs: tuple[tuple[str, str], ...]
    files: tuple[FileFact, ...]


def parse_scan(node: str, root: str, data: Mapping[str, object]) -> Snapshot:
    """A Snapshot from the scanner's JSON; a scanner error becomes a StagingError naming node."""
    if data.get("error"):
        raise StagingError(node, str(data["error"]))
    files = tuple(FileFact(*row) for row in data["files"])  # type: ignore[attr-defined]
    refs = tuple(sorted(dict(data.get("refs") or {}).items()))  # type: ignore[call-overload]
    return Snapshot(node, root, str(data["layout"]), data.get("revision"), refs, files)  # type: ignore[arg-type]


def scan_node(transport: Transport, root: str, revision: str | None, *, python: str = "python3") -> Snapshot:
    if transport.capabilities.local:  # this machine: no interpreter to start
        return parse_scan(transport.node, root, scan_snapshot(root, revision, HASHED, HASH_LIMIT))
    job = {"root": root, "revision": revision, "hashed": list(HASHED), "hash_limit": HASH_LIMIT}
    result = run_shipped(transport, python, SNAPSHOT_SCAN, [json.dumps(job)], timeout=600)
    if not result.ok:
        raise StagingError(transport.node, f"cannot list {root}: {result.tail() or 'scanner failed'}")
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise StagingError(transport.node, f"cannot list {root}: unreadable scanner output") from None
    return parse_scan(transport.node, root, data)


def check_copy(transport: Transport, root: str, reference: Snapshot, paths: Sequence[str]) -> Snapshot:
    """A node's copy of reference at root (paths snapshot-relative), read with stat, find and sha256sum:
    no interpreter to start, so it is cheap after every sync. ``scan_node`` also finds extra files."""
    # "./" so that no path can read as an option of find or stat
    base = f"./snapshots/{reference.revision}/" if reference.layout == "hf" else "./"
    result = node_files.snapshot_check(transport, root, [base + p for p in paths], HASHED, HASH_LIMIT)
    if result.exit_code == 4:
        raise StagingError(transport.node, f"{root}: {result.tail()}")
    sizes: dict[str, int] = {}
    links: dict[str, str] = {}
    digests: dict[str, str] = {}
    for line in result.stdout.splitlines():
        tag, _, rest = line.partition("\t")
        if tag == "S":
            path, _, size = rest.rpartition("\t")
            sizes[path.removeprefix(base)] = int(size)
        elif tag == "L":
            path, _, link = rest.partition("\t")
            links[path.removeprefix(base)] = link
        elif tag == "H":
            digest, _, path = rest.partition("  ")
            digests[path.removeprefix(base)] = digest
    files = []
    for p in paths:
        text = links.get(p)
        joined = os.path.normpath(os.path.join(os.path.dirname(base + p), text)) if text is not None else ".."
        blob = None if joined.startswith("..") else joined  # a link out of the repo names no blob
        if p in sizes:
            files.append(FileFact(p, "link" if text else "file", sizes[p], text, blob, digests.get(p)))
        elif text is not None:
            files.append(FileFact(p, "dangling", -1, text, blob, None))
    return Snapshot(transport.node, root, reference.layout, reference.revision, reference.refs, tuple(files))


def select(files: Sequence[FileFact], include: Sequence[str], exclude: Sequence[str]) -> tuple[FileFact, ...]:
    """The files an include/exclude glob pair keeps (globs match snapshot-relative paths; an empty
    include keeps everything; exclude wins)."""

    def hit(path: str, patterns: Sequence[str]) -> bool:
        name = path.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatch(path, p) or ("/" not in p and fnmatch.fnmatch(name, p)) for p in patterns)

    return tuple(f for f in files if (not include or hit(f.path, include)) and not hit(f.path, exclude))


@dataclass(frozen=True)
class Difference:
    """How one node's snapshot differs from the reference."""

    node: str
    revision: tuple[str | None, str | None] | None
    files: tuple[tuple[str, str], ...]  # (path, what differs)

    def message(self, reference: str) -> str:
        parts = [f"revision {self.revision[1]} (reference {reference} has {self.revision[0]})"] if self.revision else []
        parts += [f"{path}: {what}" for path, what in self.files[:_SHOWN]]
        if len(self.files) > _SHOWN:
            parts.append(f"and {len(self.files) - _SHOWN} more")
        return f"snapshot differs from {reference}'s: " + "; ".join(parts)


def compare(reference: Snapshot, other: Snapshot, *, include: Sequence[str] = (),
            exclude: Sequence[str] = ()) -> Difference | None:  # fmt: skip
    """None when other has the same files (paths, sizes, metadata hashes) as reference."""
    ref = {f.path: f for f in select(reference.files, include, exclude)}
    mine = {f.path: f for f in select(other.files, include, exclude)}
    diffs: list[tuple[str, str]] = []
    for path in sorted(ref.keys() | mine.keys()):
        a, b = ref.get(path), mine.get(path)
        if b is None:
            diffs.append((path, "missing"))
        elif a is None:
            diffs.append((path, "not in the reference"))
        elif b.kind == "dangling":
            diffs.append((path, f"broken link to {b.link}"))
        elif a.size != b.size:
            diffs.append((path, f"size {b.size} ≠ {a.size}"))
        elif a.sha256 and b.sha256 and a.sha256 != b.sha256:
            diffs.append((path, "content differs (sha256)"))
        elif a.blob and b.blob and a.blob != b.blob:
            diffs.append((path, f"points to {b.blob}, not {a.blob}"))
    revision = (reference.revision, other.revision) if reference.revision != other.revision else None
    if revision is None and not diffs:
        return None
    return Difference(other.node, revision, tuple(diffs))


def check_identity(snapshots: Sequence[Snapshot], *, reference: Snapshot | None = None,
                   include: Sequence[str] = (), exclude: Sequence[str] = ()) -> None:  # fmt: skip
    """Raise a StagingError naming every node whose snapshot differs from the reference (the first
    snapshot unless given) and the files that differ; return when all agree."""
    if not snapshots:
        return
    ref = reference or snapshots[0]
    found = [d for s in snapshots if (d := compare(ref, s, include=include, exclude=exclude)) is not None]
    if not found:
        return
    first, *rest = found
    lines = [first.message(ref.node)] + [f"{d.node}: {d.message(ref.node)}" for d in rest]
    raise StagingError(first.node, "\n".join(lines))
