"""Build a composed model directory on the node (node-side, stdlib only): a Hugging Face cache
layout under ``dst`` whose snapshot links every file of the source snapshot to its blob, with each
local file hard-linked over the entry of the same name. Prints one marked JSON line: the snapshot
directory and the roots the links point into (the container mounts those at the same path).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import sys
from typing import Any

from sparkfleet.nodes.shipped.failure import StageFailure, failure_result

RESULT_MARKER = "SPARKFLEET-COMPOSE-RESULT "


def _revision(repo_dir: str, revision: str | None) -> str:
    if revision and len(revision) == 40 and os.path.isdir(os.path.join(repo_dir, "snapshots", revision)):
        return revision
    ref = os.path.join(repo_dir, "refs", revision or "main")
    try:
        with open(ref, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        pass
    folder = os.path.join(repo_dir, "snapshots")
    snaps = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    if revision is None and len(snaps) == 1:
        return snaps[0]
    raise StageFailure(
        f"no snapshot of {repo_dir} for revision {revision or 'main'} (found {snaps or 'none'}); "
        "download the model into the node's Hugging Face cache first"
    )


def _replace_with(make: Any, dest: str) -> None:
    """Create ``dest`` through a temp name and rename it over whatever is there."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.sparkfleet-tmp{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    make(tmp)
    os.replace(tmp, dest)


def _roots(targets: list[str]) -> list[str]:
    dirs = sorted({os.path.dirname(t) for t in targets})
    kept: list[str] = []
    for d in dirs:
        if not any(d == k or d.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(d)
    return kept


def compose(args: dict[str, Any]) -> dict[str, Any]:
    """Build (or, with ``verify``, only check) the composed directory described by ``args``."""
    repo_dir, dst = str(args["repo_dir"]), str(args["dst"])
    verify = bool(args.get("verify"))
    rev = _revision(repo_dir, args.get("revision"))
    snapshot = os.path.join(repo_dir, "snapshots", rev)
    if not os.path.isdir(snapshot):
        raise StageFailure(f"snapshot {snapshot} does not exist")
    model_dir = os.path.join(dst, os.path.basename(repo_dir.rstrip("/")), "snapshots", rev)
    wanted: dict[str, str] = {}
    for base, _dirs, files in os.walk(snapshot, followlinks=True):
        for name in files:
            rel = os.path.relpath(os.path.join(base, name), snapshot)
            wanted[rel] = os.path.realpath(os.path.join(snapshot, rel))
    local: dict[str, str] = {}
    for host in args.get("local_files", []):
        if not os.path.isfile(host):
            raise StageFailure(f"local file {host} does not exist")
        local[os.path.basename(host)] = host
    problems: list[str] = []

    def fix(problem: str, dest: str, make: Any = None) -> None:
        """Report ``problem`` (verify), or put ``dest`` right: made by ``make(tmp)``, or removed."""
        if verify:
            problems.append(problem)
        elif make is None:
            os.unlink(dest)
        else:
            _replace_with(make, dest)

    if not verify:
        os.makedirs(os.path.join(model_dir, "..", "..", "refs"), exist_ok=True)
        with open(os.path.join(model_dir, "..", "..", "refs", "main"), "w", encoding="utf-8") as fh:
            fh.write(rev)
    for rel, target in sorted(wanted.items()):
        dest = os.path.join(model_dir, rel)
        if rel not in local and not (os.path.islink(dest) and os.readlink(dest) == target):
            fix(f"{dest} is not a link to {target}", dest, functools.partial(os.symlink, target))
    for name, host in sorted(local.items()):
        dest = os.path.join(model_dir, name)
        try:
            if os.path.samefile(dest, host) and not os.path.islink(dest):
                continue
        except OSError:
            pass
        try:
            fix(f"{dest} is not a hard link of {host}", dest, functools.partial(os.link, host))
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                raise StageFailure(
                    f"cannot hard-link {host} into {model_dir}: they are on different filesystems; "
                    "put the composed directory (composed_model.dir) on the filesystem that holds "
                    "the local files"
                ) from exc
            raise
    expected = set(wanted) | set(local)
    if os.path.isdir(model_dir):
        for base, _dirs, files in os.walk(model_dir):
            for name in files:
                rel = os.path.relpath(os.path.join(base, name), model_dir)
                if rel not in expected:
                    fix(f"{os.path.join(model_dir, rel)} is not part of the model", os.path.join(model_dir, rel))
    elif verify:
        problems.append(f"{model_dir} does not exist")
    # `dst/model` names the snapshot folder, so the plan can mount and pass a path it knows
    # before the revision is resolved (the first source of a composed model is the model).
    current = os.path.join(dst, "model")
    link = os.path.relpath(model_dir, dst)
    if args.get("primary", True) and not (os.path.islink(current) and os.readlink(current) == link):
        fix(f"{current} is not a link to {link}", current, functools.partial(os.symlink, link))
    return {
        "model_dir": model_dir, "revision": rev, "mount_roots": _roots(list(wanted.values())),
        "links": len(wanted) - len(set(wanted) & set(local)), "hard_links": len(local), "problems": problems,
    }  # fmt: skip


if __name__ == "__main__":
    # One JSON argument in, one marked JSON line out.
    try:
        result: dict[str, Any] = {"ok": True, **compose(json.loads(sys.argv[1]))}
    except (StageFailure, OSError) as exc:
        result = failure_result(exc)
    sys.stdout.write(RESULT_MARKER + json.dumps(result) + "\n")
    sys.exit(0 if result["ok"] else 3)
