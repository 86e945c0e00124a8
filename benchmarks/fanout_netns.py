"""Pipeline fan-out against today's push, side by side in one run, on a network-namespace fleet.

Four nodes (tests/fleet/netns.py), every node's fabric link shaped by tc to the same rate; a
synthetic Hugging Face snapshot (four shards) on node0. Three copies, each into fresh folders:

- one target alone: node0 → node1 (rsync push, today's sync);
- push: node0 → node1, node2, node3 at once (today's sync: the source's link is shared);
- pipeline: node0 → node1 → node2 → node3 (apply/staging/pipeline.py).

Prints the wall time of each, pipeline ÷ alone (the bar: ≤ 1.3) and push ÷ alone, then checks
every copy byte for byte against the source (sha256 of every file) and that no tar, tee, ssh or
rsync is left in any namespace. Needs root, iproute2, tc, sshd, rsync.

    sudo .venv/bin/python -m benchmarks.fanout_netns --size-mib 2048 --mbit 400
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fleet.netns import NetnsFleet, names_in_use, usable

from sparkfleet.apply.staging.pipeline import pipeline
from sparkfleet.apply.staging.snapshot_identity import check_copy, check_identity, scan_node
from sparkfleet.apply.staging.transfer import Endpoint, sync_node, transfer_list
from sparkfleet.config.cluster import load_cluster
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.transport.ssh import SshTransport

REPO = "models--acme--bench"
REV = "b" * 40
LEFT = {"tar", "tee", "ssh", "rsync"}


def make_snapshot(root: Path, size: int) -> None:
    """A hub-cache repo: four shards of size/4 random bytes, config and index, as blobs + links."""
    files = {"config.json": b'{"model_type": "bench"}', "model.safetensors.index.json": b'{"weight_map": {}}'}
    (root / "blobs").mkdir(parents=True)
    snap = root / "snapshots" / REV
    snap.mkdir(parents=True)
    for i in range(1, 5):
        name = f"model-{i:05d}-of-00004.safetensors"
        tmp = root / "blobs" / "tmp"
        h = hashlib.sha256()
        with tmp.open("wb") as f:
            left = size // 4
            while left:
                chunk = os.urandom(min(left, 8 << 20))
                f.write(chunk)
                h.update(chunk)
                left -= len(chunk)
        tmp.rename(root / "blobs" / h.hexdigest())
        (snap / name).symlink_to(f"../../blobs/{h.hexdigest()}")
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        (root / "blobs" / digest).write_bytes(data)
        (snap / name).symlink_to(f"../../blobs/{digest}")
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(REV)


def digests(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted((folder / "snapshots" / REV).iterdir()):
        h = hashlib.sha256()
        with p.open("rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
        out[p.name] = h.hexdigest()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--mbit", type=float, default=400.0)
    args = ap.parse_args()
    why = usable()
    if why:
        print(f"cannot run: {why}")
        return 2
    work = Path(tempfile.mkdtemp(prefix="sf-fanout-"))
    fleet = NetnsFleet(4, work, odd=None, name="fanout")
    try:
        fleet.fabric_sshd()
        for i in range(4):
            fleet.shape(i, args.mbit)
        cluster = load_cluster(fleet.cluster_file)
        nodes = {n.name: n for n in cluster.nodes}
        transports = {name: SshTransport(node) for name, node in nodes.items()}
        src_path = work / "node0" / "src" / REPO
        make_snapshot(src_path, args.size_mib << 20)

        def end(name: str, path: Path) -> Endpoint:
            n = nodes[name]
            return Endpoint(transports[name], str(path), n.fabric_ip, n.user, n.ssh_port)

        source = end("node0", src_path)
        snapshot = scan_node(source.transport, source.path, REV, python=sys.executable)
        _, total = transfer_list(snapshot, (), ())
        kept = [f.path for f in snapshot.files]
        reference = digests(src_path)
        targets = ("node1", "node2", "node3")
        results: dict[str, float] = {}

        def dst(method: str, name: str) -> Path:
            return work / name / method / REPO

        start = time.monotonic()
        sync_node(source, end("node1", dst("alone", "node1")), snapshot, method="rsync")
        results["one target alone (push)"] = time.monotonic() - start

        start = time.monotonic()
        fan_out(targets, lambda n: sync_node(source, end(n, dst("push", n)), snapshot, method="rsync")).raise_first()
        results["push to 3 (today)"] = time.monotonic() - start

        start = time.monotonic()
        pipeline(source, [end(n, dst("pipeline", n)) for n in targets], snapshot)
        results["pipeline to 3"] = time.monotonic() - start

        alone = results["one target alone (push)"]
        print(f"{args.size_mib} MiB snapshot ({total:,} bytes), every fabric link shaped to {args.mbit:g} Mbit/s")
        for what, took in results.items():
            print(f"  {what:<26} {took:7.1f} s  {total * 8 / took / 1e6:7.1f} Mbit/s per target  "
                  f"{took / alone:4.2f} × alone")  # fmt: skip
        ok = results["pipeline to 3"] <= 1.3 * alone
        print(f"  bar: pipeline ≤ 1.3 × alone: {'met' if ok else 'NOT met'}")

        copies = [dst("alone", "node1")] + [dst(m, n) for m in ("push", "pipeline") for n in targets]
        same = all(digests(c) == reference for c in copies)
        checked = [check_copy(transports[c.parts[-3]], str(c), snapshot, kept) for c in copies]
        check_identity(checked, reference=snapshot)
        print(f"  every copy byte-identical to the source (sha256 of every file): {same}")
        left = {i: sorted(LEFT & set(fleet.processes(i))) for i in range(4)}
        print(f"  left running in the namespaces: {({k: v for k, v in left.items() if v}) or 'nothing'}")
        for t in transports.values():
            t.close()
        return 0 if ok and same and not any(left.values()) else 1
    finally:
        tag = fleet.tag
        fleet.close()
        shutil.rmtree(work, ignore_errors=True)
        assert names_in_use(tag) == []


if __name__ == "__main__":
    raise SystemExit(main())
