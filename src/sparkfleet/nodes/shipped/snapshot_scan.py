"""Scan one model snapshot on the node (node-side, stdlib only): every file's path, size, link
and, for the small files that decide how a checkpoint is read, its sha256; compared across
nodes by ``sparkfleet.apply.staging.snapshot_identity``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sys
from collections.abc import Sequence


def scan_snapshot(root: str, revision: str | None, hashed: Sequence[str], hash_limit: int) -> dict:
    """List a snapshot. In a hub cache repo (``models--org--name`` with ``snapshots/``), the one
    revision (a commit, or a ref like ``main``; ``None`` is ``main``); otherwise the folder itself.

    Returns ``{"layout", "revision", "refs", "files": [[path, kind, size, link, blob, sha256]],
    "error"}``; paths are relative to the snapshot, ``blob`` to ``root``.
    """
    if not os.path.isdir(root):
        return {"error": f"{root} does not exist or is not a folder"}
    out: dict = {"layout": "dir", "revision": None, "refs": {}, "files": [], "error": None}
    base = root
    snapshots = os.path.join(root, "snapshots")
    if os.path.basename(root.rstrip("/")).startswith(("models--", "datasets--")) and os.path.isdir(snapshots):
        out["layout"] = "hf"
        refs_dir = os.path.join(root, "refs")
        refs: dict[str, str] = {}
        for dirpath, _dirs, names in os.walk(refs_dir):
            for name in names:
                path = os.path.join(dirpath, name)
                with open(path) as fh:
                    refs[os.path.relpath(path, refs_dir)] = fh.read().strip()
        wanted = revision or "main"
        commit = wanted if os.path.isdir(os.path.join(snapshots, wanted)) else refs.get(wanted)
        if commit is None or not os.path.isdir(os.path.join(snapshots, commit)):
            have = ", ".join(sorted(os.listdir(snapshots))) or "none"
            return {"error": f"{root}: revision {wanted!r} is not in the cache (snapshots: {have})"}
        out["revision"] = commit
        out["refs"] = {name: sha for name, sha in refs.items() if sha == commit}
        base = os.path.join(snapshots, commit)
    files = []
    for dirpath, dirs, names in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".sparkfleet-partial"))
        for name in sorted(names):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, base)
            link = os.readlink(path) if os.path.islink(path) else None
            blob = None
            if link is not None:
                real = os.path.realpath(path)
                inside = os.path.relpath(real, root)
                blob = None if inside.startswith("..") else inside
                if not os.path.isfile(real):
                    files.append([rel, "dangling", -1, link, blob, None])
                    continue
            size = os.path.getsize(path)
            digest = None
            if size <= hash_limit and any(fnmatch.fnmatch(name, p) for p in hashed):
                h = hashlib.sha256()
                with open(path, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                digest = h.hexdigest()
            files.append([rel, "link" if link is not None else "file", size, link, blob, digest])
    out["files"] = files
    return out


if __name__ == "__main__":
    # One JSON argument {"root", "revision", "hashed", "hash_limit"} in, the listing as one JSON line out.
    args = json.loads(sys.argv[1])
    found = scan_snapshot(args["root"], args.get("revision"), tuple(args["hashed"]), int(args["hash_limit"]))
    sys.stdout.write(json.dumps(found) + "\n")
