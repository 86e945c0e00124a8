"""Sync speed on the loopback fleet: first sync, unchanged re-sync, one changed file.

A 2 GiB snapshot in Hugging Face cache layout (16 shards, blobs named by sha256, relative
symlinks, refs/main) is synced from a controller path to N loopback nodes (real sshd per node,
real rsync over SSH) three times:

1. first sync — every blob crosses the wire once per node;
2. second sync, nothing changed — Bar: no file data sent (rsync's "Literal data") and a wall
   time ≤ 5 % of the first sync's;
3. a new revision in which one 100 MiB shard changed — Bar: ≈ 100 MiB sent per node, not 2 GiB.

    python benchmarks/sync_speed.py [--nodes 4] [--gib 2] [--keep]

Needs root or port 2222 for sshd (tests/fleet), and (nodes + 1) × size of free disk under
$TMPDIR; everything is removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fleet.loopback import LoopbackFleet  # noqa: E402

from sparkfleet.apply.staging.phase import StagePhase, distribute  # noqa: E402
from sparkfleet.apply.staging.transfer import SyncReport  # noqa: E402
from sparkfleet.config.cluster import load_cluster  # noqa: E402
from sparkfleet.config.recipe import load_recipe  # noqa: E402
from sparkfleet.nodes.transport.ssh import SshTransport  # noqa: E402
from sparkfleet.plan.build import plan  # noqa: E402

MiB = 1 << 20
REPO = "models--acme--bench"
CHANGED = "model-00001-of-00016.safetensors"


def write_blob(repo: Path, snap: Path, name: str, size: int) -> None:
    """Write size random bytes as a hub blob and link snap/name to it."""
    tmp = repo / "blobs" / f".incoming-{name}"
    digest = hashlib.sha256()
    with open(tmp, "wb") as fh:
        left = size
        while left:
            chunk = os.urandom(min(left, 16 * MiB))
            digest.update(chunk)
            fh.write(chunk)
            left -= len(chunk)
    blob = repo / "blobs" / digest.hexdigest()
    tmp.rename(blob)
    link = snap / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))


def link_same(repo: Path, old: Path, new: Path, name: str) -> None:
    (new / name).symlink_to(os.readlink(old / name))


def make_snapshot(repo: Path, rev: str, total: int) -> None:
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    for name, text in (("config.json", '{"model_type": "bench"}'), ("tokenizer.json", '{"v": 1}')):
        data = text.encode()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    write_blob(repo, snap, CHANGED, 100 * MiB)
    rest = (total - 100 * MiB) // 15
    for i in range(2, 17):
        write_blob(repo, snap, f"model-{i:05d}-of-00016.safetensors", rest)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)


def new_revision(repo: Path, old_rev: str, rev: str) -> None:
    """A revision where only the 100 MiB shard changed (what the hub writes for such a commit)."""
    old, new = repo / "snapshots" / old_rev, repo / "snapshots" / rev
    new.mkdir(parents=True)
    for entry in old.iterdir():
        if entry.name != CHANGED:
            link_same(repo, old, new, entry.name)
    write_blob(repo, new, CHANGED, 100 * MiB)
    (repo / "refs" / "main").write_text(rev)


def figures(label: str, report: StagePhase, seconds: float) -> tuple[float, int, int]:
    sent = sum(r.bytes_sent for r in report.of(SyncReport))
    files = sum(r.files_sent for r in report.of(SyncReport))
    per_node = ", ".join(f"{r.node} {r.bytes_sent / MiB:.1f} MiB/{r.files_sent} files" for r in report.of(SyncReport))
    print(f"{label:<28} {seconds:8.2f} s   data sent {sent / MiB:9.1f} MiB   files {files:3d}   ({per_node})")
    return seconds, sent, files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--keep", action="store_true", help="leave the work folder in place")
    args = ap.parse_args()
    total = int(args.gib * 1024) * MiB
    work = Path(tempfile.mkdtemp(prefix="sparkfleet-sync-bench-"))
    try:
        t0 = time.monotonic()
        source = work / "src" / REPO
        make_snapshot(source, "a" * 40, total)
        print(f"snapshot: {total / MiB:.0f} MiB in HF layout, {args.nodes} loopback nodes "
              f"(made in {time.monotonic() - t0:.1f} s; load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} cores)")  # fmt: skip
        fleet = LoopbackFleet(args.nodes, work / "fleet")
        try:
            recipe_dir = work / "recipe"
            recipe_dir.mkdir()
            (recipe_dir / "recipe.toml").write_text(
                'engine = "vllm"\nmodel = "acme/bench"\ndocker_image = "sparkfleet/test:latest"\n'
                f"required_nodes = {args.nodes}\ntensor_parallel_size = {args.nodes}\n"
                f'[[staging]]\nkind = "sync"\nid = "weights"\nsrc = "{source}"\n'
                f'dst = "{{{{hf}}}}/hub/{REPO}"\n'
            )
            p = plan(load_recipe(recipe_dir), load_cluster(fleet.cluster_file), "bench")
            transports = {r.node.name: SshTransport(r.node) for r in p.ranks}

            start = time.monotonic()
            first = figures("1. first sync", distribute(p, transports), time.monotonic() - start)
            start = time.monotonic()
            second = figures("2. unchanged re-sync", distribute(p, transports), time.monotonic() - start)
            new_revision(source, "a" * 40, "b" * 40)
            start = time.monotonic()
            third = figures("3. one 100 MiB file changed", distribute(p, transports), time.monotonic() - start)
        finally:
            fleet.close()
        ratio = second[0] / first[0]
        per_node_changed = third[1] / args.nodes
        ok2 = second[1] == 0 and ratio <= 0.05
        ok3 = 0.95 * 100 * MiB <= per_node_changed <= 1.05 * 100 * MiB
        print(f"bar: re-sync sent {second[1]} bytes of file data and took {100 * ratio:.1f} % of the first "
              f"sync's time (≤ 5 %): {'PASS' if ok2 else 'FAIL'}")  # fmt: skip
        print(f"bar: one changed 100 MiB file re-copied {per_node_changed / MiB:.1f} MiB per node "
              f"(≈ 100 MiB, snapshot {total / MiB:.0f} MiB): {'PASS' if ok3 else 'FAIL'}")  # fmt: skip
        return 0 if ok2 and ok3 else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
