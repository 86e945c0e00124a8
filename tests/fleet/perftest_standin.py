#!/usr/bin/env python3
"""A stand-in for perftest's `ib_write_bw` / `ib_write_lat` on nodes where RDMA cannot exist.

This machine's kernel has no InfiniBand subsystem, so no ConnectX can be driven here; the namespace
fleet (tests/fleet/netns.py) links this script into each node's PATH under both names. What it
keeps real is what doctor depends on besides the RDMA transfer itself:

- the argv: the flags real perftest lists in `--help` (tests/unit/test_perftest_standin.py checks
  them against the installed perftest), an unknown flag refused as perftest refuses one;
- the device: `-d HCA` must exist in the node's sysfs tree (`$SPARKFLEET_SYSFS_ROOT`, the one the
  rdma fact reads) and `-x N` must be a populated GID of its port, else it fails as perftest does;
- the pairing: without a host it is the server: it listens on `-p PORT` (all addresses, as
  perftest does), prints perftest's "Waiting for client to connect..." banner, serves one client
  and exits; with a host it is the client and connects to HOST:PORT (no server: perftest's
  "Couldn't connect" and exit 1); the test lasts `-D` seconds, or as long as `-n` writes of the
  capture's size over `-q` QPs take at the rate it reports;
- the output: the committed capture of real perftest output between two DGX Sparks
  (tests/fixtures/fabric/<tool>-dgx-spark.txt) with the device name set to `-d` and, for
  ib_write_bw, the rates multiplied by the smaller of the two ends' `scale` files (a file named
  `scale` beside the link, default 1): a test makes one node's HCA slow by writing 0.1 there.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import time
from pathlib import Path

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fabric"
STARS = "*" * 36
BANNER = f"{STARS}\n* Waiting for client to connect... *\n{STARS}\n"

# The flags doctor passes, each as perftest's --help spells it (short, long); ib_write_lat's
# --help lists neither -q (it refuses it: "Multiple QPs only available on bw tests") nor --report_gbits.
FLAGS = (("-d", "--ib-dev"), ("-x", "--gid-index"), ("-p", "--port"), ("-D", "--duration"), ("-q", "--qp"),
         ("-n", "--iters"))  # fmt: skip
SWITCHES = (("-F", "--CPU-freq"), ("--report_gbits",))
BW_ONLY = ("--qp", "--report_gbits")


def accepted(tool: str) -> tuple[tuple[str, ...], ...]:
    """The flags the stand-in accepts as `tool`."""
    return tuple(n for n in (*FLAGS, *SWITCHES) if tool == "ib_write_bw" or n[-1] not in BW_ONLY)


def parser(tool: str = "ib_write_bw") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=tool, add_help=False, allow_abbrev=False)
    p.set_defaults(qp=None, report_gbits=False)
    for names in accepted(tool):
        dest = names[-1].lstrip("-").replace("-", "_")
        if names in SWITCHES:
            p.add_argument(*names, action="store_true", dest=dest)
        else:
            p.add_argument(*names, dest=dest)
    p.add_argument("host", nargs="?")
    return p


def _scale() -> float:
    f = Path(os.path.abspath(sys.argv[0])).parent / "scale"
    return float(f.read_text().strip()) if f.exists() else 1.0


def _check_device(hca: str | None, gid: str | None) -> str | None:
    root = Path(os.environ.get("SPARKFLEET_SYSFS_ROOT", "/sys")) / "class" / "infiniband"
    if not hca or not (root / hca).is_dir():
        return f" IB device {hca} not found\n Unable to find the Infiniband/RoCE device\n"
    if gid is not None:
        entry = next((root / hca / "ports").glob(f"*/gids/{gid}"), None)
        if entry is None or set(entry.read_text().strip().replace(":", "")) == {"0"}:
            return f" Failed to query GID index {gid} of {hca}\n Couldn't create IB resources\n"
    return None


def _output(tool: str, hca: str, scale: float) -> str:
    text = (CAPTURES / f"{tool}-dgx-spark.txt").read_text()
    text = re.sub(r"(Device\s*:\s*)\S+", lambda m: m.group(1) + hca, text)
    if tool != "ib_write_bw" or scale == 1.0:
        return text
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#bytes"):
            size, iters, peak, avg, rate = lines[i + 1].split()
            lines[i + 1] = (f" {size:<10} {iters:<16} {float(peak) * scale:.2f}{'':13}{float(avg) * scale:.2f}"
                            f"{'':13}{float(rate) * scale:.6f}\n")  # fmt: skip
            break
    return "".join(lines)


def _seconds(tool: str, args: argparse.Namespace, text: str) -> float:
    """How long the real test runs: -D, else its bytes at the reported rate (ib_write_bw)."""
    if args.duration:
        return float(args.duration)
    if tool != "ib_write_bw":
        return 0.0
    lines = text.splitlines()
    row = next(lines[i + 1].split() for i, x in enumerate(lines) if x.lstrip().startswith("#bytes"))
    size, rate = int(row[0]), float(row[3])
    return int(args.iters or 5000) * int(args.qp or 1) * size * 8 / (rate * 1e9) if rate > 0 else 0.0


def main(argv: list[str]) -> int:
    tool = Path(sys.argv[0]).name
    try:
        args = parser(tool).parse_args(argv)
    except SystemExit:
        return 1
    why = _check_device(args.ib_dev, args.gid_index)
    if why:
        sys.stderr.write(why)
        return 1
    port = int(args.port or 18515)
    mine = _scale()
    if args.host is None:  # the server: one client, then exit
        with socket.create_server(("0.0.0.0", port), reuse_port=False) as srv:
            sys.stdout.write(BANNER)
            sys.stdout.flush()
            conn, _ = srv.accept()
        with conn, conn.makefile("rw") as f:
            theirs = float(f.readline().split()[1])
            f.write(f"scale {mine}\n")
            f.flush()
            f.readline()  # the client's "done" (or its end)
        sys.stdout.write(_output(tool, args.ib_dev, min(mine, theirs)))
        return 0
    try:
        conn = socket.create_connection((args.host, port), timeout=5)
    except OSError:
        sys.stderr.write(f" Couldn't connect to {args.host}:{port}\n Unable to open file descriptor for socket "
                         "connection Unable to init the socket connection\n")  # fmt: skip
        return 1
    with conn, conn.makefile("rw") as f:
        f.write(f"scale {mine}\n")
        f.flush()
        theirs = float(f.readline().split()[1])
        text = _output(tool, args.ib_dev, min(mine, theirs))
        time.sleep(_seconds(tool, args, text))
        sys.stdout.write(text)
        f.write("done\n")
        f.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
