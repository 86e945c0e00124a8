"""Orchestration overhead of up / status / down on loopback fleets of several sizes, side by side
(Bar, issue 32: `up` ≤ 1.0 s wall at 4 nodes). Simulated nodes share this machine's cores, so
figures at larger sizes measure the rig more than sparkfleet: the round trips and SSH
connections per node are what carries over to a real fleet. `status` is printed beside it; its
earlier bar (≤ 0.5 s, when it read pid files with a shell script instead of asking the node's
agent) is retired with that script.

    python benchmarks/lifecycle_overhead.py --nodes 4 [--rounds 7] [--root]

Each node is a real sshd on its own 127.0.0.x address; the CLI runs as a user would
(`sparkfleet up|status|down`, wall time of the whole command, Python start-up included). Rank 0
is the stand-in engine (tests/standin_engine.py), which serves as soon as its interpreter is up;
the other ranks are `sleep`: a stand-in worker has nothing to do, and N−1 Python interpreters
booting on the 2 shared cores while sparkfleet starts the head are engine start-up (on a fleet
each boots on its own node), not orchestration. Per command it reports, from the transport's
trace (SPARKFLEET_TRACE) and the CLI's rusage:

* wall: the whole command;
* cpu: the controller's CPU (sparkfleet and its ssh clients, user + sys);
* rt/node: round trips per node (the most any node got): SSH calls and requests over the node's
  agent session (opening the session is not one: its first request goes with it);
* ssh/node: SSH connections per node (the most any node got): ssh clients started, each an SSH
  channel, a shell and a command on the node (one of them the node's agent session);
* nodes: CPU the nodes spent on the command (their SSH sessions and sparkfleet's agents there;
  not the engines) — on a real fleet
  each node has its own cores, here all N share the same 2, so at 16 nodes this alone is
  ~nodes/2 s of the wall time;
* engines: up's readiness wait — the stand-in engines starting on this shared machine (N
  Python interpreters on 2 cores), which sparkfleet only watches;
* own: wall minus that wait — sparkfleet's own time (CPU, round trips, its waits).

The nodes' login user is a dedicated account with a plain /bin/sh: on this test machine root's
~/.bashrc runs `pyenv init`, which adds ~0.3 s to every SSH command (bash sources ~/.bashrc for
ssh sessions). That cost belongs to the machine, not to sparkfleet; --root prints those figures
too. Run as root.

The fleets of every size given are up for the whole run and take turns, round by round, so the
machine's drift (a fifth, minute to minute, on the 2-core test VM) falls on every size alike.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fleet import loopback_fleet  # noqa: E402
from tests.fleet.loopback import LoopbackFleet, sessions_cpu  # noqa: E402

USER = "sparkfleet-bench"
OPS = ("up", "status", "down")
# sh -c's $0 is the python, "$@" the stand-in and its flags; the agent sets SPARKFLEET_RANK.
WORKERS_SLEEP = '[ "$SPARKFLEET_RANK" = 0 ] && exec "$0" "$@"; exec sleep 2147483647'
UP_BAR_S = 1.0  # up at 4 nodes, wall


def ensure_user() -> None:
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", USER], check=True)
    # sshd (without PAM) refuses accounts whose password field is locked ("!").
    subprocess.run(["usermod", "-p", "*", USER], check=True)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli(*args: str, env: dict[str, str], fleet: LoopbackFleet) -> dict[str, float]:
    """Run one command; its wall and CPU time and, from its trace, round trips and the wait."""
    trace = Path(env["SPARKFLEET_TRACE"])
    trace.write_text("")
    nodes = sessions_cpu(fleet)
    cpu = _children_cpu()
    start = time.perf_counter()
    beside = Path(sys.executable).with_name("sparkfleet")  # this interpreter's venv first
    exe = str(beside) if beside.exists() else shutil.which("sparkfleet") or "sparkfleet"
    proc = subprocess.run([exe, *args], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"sparkfleet {' '.join(args)} failed:\n{proc.stderr}")
    per_node: dict[str, int] = {}
    ssh_per_node: dict[str, int] = {}
    wait = 0.0
    for line in trace.read_text().splitlines():
        kind, node, t0, t1, _ = line.split("\t")
        if kind in ("ssh", "ssh-agent"):
            per_node[node] = per_node.get(node, 0) + 1
        if kind in ("ssh", "ssh-stream"):
            ssh_per_node[node] = ssh_per_node.get(node, 0) + 1
        if kind == "phase":
            wait += float(t1) - float(t0)
    return {"wall": elapsed, "cpu": _children_cpu() - cpu, "rt": max(per_node.values(), default=0),
            "ssh": max(ssh_per_node.values(), default=0),
            "engines": wait, "own": elapsed - wait, "nodes": sessions_cpu(fleet) - nodes}  # fmt: skip


@contextlib.contextmanager
def fleet_of(nodes: int, user: str | None) -> Iterator[tuple[LoopbackFleet, list[str], dict[str, str], str]]:
    """A running loopback fleet of ``nodes`` with its stand-in recipe: (fleet, up's arguments, the
    CLI's environment, the deployment's name); torn down (deployment and sshds) on exit."""
    work = Path(tempfile.mkdtemp(prefix="sfbench"))
    work.chmod(0o755)
    standin = work / "standin_engine.py"
    shutil.copy(ROOT / "tests" / "standin_engine.py", standin)
    standin.chmod(0o644)
    name = f"bench{nodes}"
    recipe = work / name
    recipe.mkdir()
    python = "/usr/bin/python3" if user else sys.executable
    (recipe / "recipe.toml").write_text(
        'engine = "sglang"\nmodel = "org/standin"\nport = 18950\nrendezvous_port = 18951\n'
        f"required_nodes = {nodes}\ntensor_parallel_size = {nodes}\n"
        f'entrypoint = ["/bin/sh", "-c", {WORKERS_SLEEP!r}, "{python}", "{standin}"]\n'
    )
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(work / "controller-state"),
           "SPARKFLEET_TRACE": str(work / "trace.tsv")}  # fmt: skip
    try:
        with loopback_fleet(nodes, work / "fleet", user=user, first_octet=60) as fleet:
            if user:
                fleet.authorized_keys.chmod(0o644)
                for node in fleet.nodes:
                    shutil.chown(node.state_dir, user)
                    shutil.chown(node.hf_cache, user)
                for path in (fleet.workdir, fleet.workdir / "hf", fleet.workdir / "state"):
                    if path.exists():
                        path.chmod(0o755)
            up_args = ["up", str(recipe), "--cluster", str(fleet.cluster_file)]
            try:
                cli(*up_args, env=env, fleet=fleet)  # warm-up: opens the SSH masters
                cli("down", name, env=env, fleet=fleet)
                yield fleet, up_args, env, name
            finally:
                # A failed command must not leave stand-in ranks behind the fleet it tears down.
                subprocess.run([str(Path(sys.executable).with_name("sparkfleet")), "down", name], env=env,
                               capture_output=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(sizes: list[int], rounds: int, user: str | None, label: str) -> dict[int, dict[str, dict[str, float]]]:
    """Median of each figure of each command over ``rounds`` up/status/down cycles per fleet size.

    Every size's fleet is up for the whole run and the sizes take turns round by round (the
    order reversed every other round): this machine's speed drifts by a fifth from minute to
    minute, and measuring one size after the other put the drift into the ratio."""
    runs: dict[int, dict[str, list[dict[str, float]]]] = {n: {op: [] for op in OPS} for n in sizes}
    with contextlib.ExitStack() as stack:
        fleets = {n: stack.enter_context(fleet_of(n, user)) for n in sizes}
        for i in range(rounds):
            for n in sizes if i % 2 == 0 else sizes[::-1]:
                fleet, up_args, env, name = fleets[n]
                runs[n]["up"].append(cli(*up_args, env=env, fleet=fleet))
                runs[n]["status"].append(cli("status", name, env=env, fleet=fleet))
                runs[n]["down"].append(cli("down", name, env=env, fleet=fleet))
    out = {}
    for n in sizes:
        medians = {op: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for op, rs in runs[n].items()}
        print(f"\n{n} nodes, {label}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}:")
        for op, m in medians.items():
            print(f"  {op:<6} wall {m['wall']:.2f} s  own {m['own']:.2f} s  engines {m['engines']:.2f} s  "
                  f"cpu {m['cpu']:.2f} s  nodes {m['nodes']:.2f} s  rt/node {m['rt']:.0f}  ssh/node {m['ssh']:.0f}"
                  f"  (median of {rounds})")  # fmt: skip
        out[n] = medians
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4], help="fleet sizes, measured in this order")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--root", action="store_true", help="also measure with root as the nodes' login user")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (it creates the benchmark's node user and binds sshd to port 22)")
    ensure_user()
    print(f"loopback fleets of {opts.nodes} nodes, stand-in ranks, {opts.rounds} rounds; {os.cpu_count()} cores")
    lean = measure(opts.nodes, opts.rounds, USER, f"nodes log in as {USER} (plain /bin/sh)")
    if opts.root:
        measure(opts.nodes, opts.rounds, None, "nodes log in as root (~/.bashrc runs pyenv init)")
    ok = True
    if 4 in lean:
        up, status = lean[4]["up"], lean[4]["status"]
        ok &= up["wall"] <= UP_BAR_S
        print(
            f"\nup at 4 nodes: {up['wall']:.2f} s wall (bar ≤ {UP_BAR_S} s), {up['rt']:.0f} round trips and "
            f"{up['ssh']:.0f} SSH connections per node"
        )
        print(
            f"status at 4 nodes: {status['wall']:.2f} s wall, {status['rt']:.0f} round "
            f"trips and {status['ssh']:.0f} SSH connections per node"
        )
    print(f"bar: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
