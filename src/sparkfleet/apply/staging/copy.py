"""``copy`` staging: push small files (tuning tables, chat templates) to a folder on every node.

Every rank must read the same bytes: ranks whose DSpark tables differ build different verify
shapes and the collective hangs. So each file is hashed ON the node after the write and compared
with the controller's hash (a difference aborts ``up``); a file already there is not sent again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from sparkfleet.apply.staging.base import Context, Runner
from sparkfleet.errors import StagingError, TransportError
from sparkfleet.nodes import files as node_files
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.staging import StagingStep
from sparkfleet.plan.staging.copy import Copy


@dataclass(frozen=True)
class LocalFile:
    """A controller file to push, with its hash."""

    path: Path
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class CopyReport:
    """What one copy step did on one node."""

    node: str
    dst: str
    sent: tuple[str, ...]
    unchanged: tuple[str, ...]
    bytes_sent: int


def local_files(paths: Sequence[str], base: Path, step_id: str) -> tuple[LocalFile, ...]:
    """Read and hash the files a copy step names (relative paths are relative to base, the
    recipe's folder); a missing file is a StagingError naming it."""
    out = []
    for raw in paths:
        path = Path(raw) if Path(raw).is_absolute() else base / raw
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise StagingError("controller", f"staging {step_id!r}: cannot read {path}: {exc.strerror}") from None
        out.append(LocalFile(path, path.name, hashlib.sha256(data).hexdigest(), len(data)))
    names = [f.name for f in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise StagingError("controller", f"staging {step_id!r}: two files are both named {twice[0]!r}")
    return tuple(out)


def remote_hashes(transport: Transport, paths: Sequence[str]) -> dict[str, str]:
    """sha256 of each path that exists on the node (missing paths are left out)."""
    result = node_files.sha256_of(transport, paths)
    if not result.ok:
        raise StagingError(transport.node, f"cannot hash files on the node: {result.tail()}")
    return node_files.parse_sha256sum(result.stdout)


def copy_files(transport: Transport, files: Sequence[LocalFile], dst: str, step_id: str) -> CopyReport:
    """Push files into the folder dst on the node; verify every one by hash on the node."""
    targets = {f.name: f"{dst.rstrip('/')}/{f.name}" for f in files}
    before = remote_hashes(transport, list(targets.values()))
    todo = [f for f in files if before.get(targets[f.name]) != f.sha256]
    for f in todo:
        try:
            transport.put(f.path, targets[f.name], mode=0o644)
        except (TransportError, OSError) as exc:
            why = f"staging {step_id!r}: could not write {targets[f.name]}: {exc}"
            raise StagingError(transport.node, why) from None
    after = remote_hashes(transport, [targets[f.name] for f in todo]) if todo else {}
    for f in todo:
        got = after.get(targets[f.name])
        if got != f.sha256:
            seen = "is missing after the write" if got is None else f"has sha256 {got[:12]}…"
            why = f"staging {step_id!r}: {targets[f.name]} {seen}, expected {f.sha256[:12]}… ({f.path})"
            raise StagingError(transport.node, why)
    unchanged = tuple(f.name for f in files if f not in todo)
    return CopyReport(transport.node, dst, tuple(f.name for f in todo), unchanged, sum(f.size for f in todo))


def run(ctx: Context, steps: Sequence[StagingStep]) -> list[CopyReport]:
    """Push the entry's files to every node at once (relative names: from the recipe's folder)."""
    entry, step_id = steps[0].entry, steps[0].id
    assert isinstance(entry, Copy) and ctx.plan is not None
    base = Path(ctx.plan.recipe_source).parent if ctx.plan.recipe_source else Path.cwd()
    names = list(entry.files)
    if not names and entry.src:
        folder = Path(entry.src)
        names = sorted(str(p) for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    if not names:
        raise StagingError("controller", f"staging {step_id!r}: copy names no files (files = [...] or src)")
    files = local_files(names, base, step_id)
    return ctx.parallel({s.node: partial(copy_files, ctx.transport(s.node), files, s.dst, step_id) for s in steps})


RUNNER = Runner(Copy, "distribute", run)
