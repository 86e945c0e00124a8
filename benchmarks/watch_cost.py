"""What `sparkfleet watch` costs per poll and per node, on a 4-node loopback fleet (a real sshd
per node) serving a stand-in engine: the poll's wall time, each node's round trip, the CPU the
shipped agent uses on each node, and the controller's own CPU per poll.

Run as root (the fleet's sshd): `flock /tmp/sparkfleet-engine.lock .venv/bin/python
benchmarks/watch_cost.py [POLLS]`. Prints figures only; docs/watch.md quotes them.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fleet import loopback_fleet  # noqa: E402
from tests.integration.conftest import standin_recipe  # noqa: E402

NODES = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "sparkfleet.cli.main", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"sparkfleet {' '.join(args)} failed:\n{done.stderr}")


def _ms(values: list[float]) -> str:
    p90 = sorted(values)[int(len(values) * 0.9)]
    return f"median {statistics.median(values) * 1000:6.1f} ms, p90 {p90 * 1000:6.1f} ms"


def main() -> None:
    polls = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    with tempfile.TemporaryDirectory(prefix="sparkfleet-watch-bench-") as tmp:
        os.environ["SPARKFLEET_STATE_DIR"] = f"{tmp}/state"
        from sparkfleet.apply.watch import Watcher

        name = "test-watch-bench"
        with loopback_fleet(NODES, Path(tmp) / "fleet") as fleet:
            recipe = standin_recipe(Path(tmp) / name, nodes=NODES, port=_free_port())
            _cli("up", str(recipe), "--cluster", str(fleet.cluster_file))
            try:
                watcher = Watcher(name, interval=1)
                watcher.poll()  # opens each node's ssh master connection: not a steady-state poll
                walls, cpus, trips, agents = [], [], [], []
                for _ in range(polls):
                    cpu = time.process_time()
                    poll = watcher.poll()
                    cpus.append(time.process_time() - cpu)
                    walls.append(poll.seconds)
                    for answer in poll.nodes.values():
                        assert not isinstance(answer, str), answer
                        trips.append(answer.seconds)
                        agents.append(answer.agent_cpu_s or 0.0)
            finally:
                _cli("down", name)
    load = os.getloadavg()
    print(
        f"watch cost: {NODES} loopback nodes (sshd each), stand-in engine, {polls} polls; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores"
    )
    print(f"  poll wall time (all nodes in parallel, health + /metrics) {_ms(walls)}")
    print(f"  per node round trip (ssh + agent)                        {_ms(trips)}")
    print(f"  agent CPU on each node per poll                          {_ms(agents)}")
    print(f"  controller CPU per poll                                  {_ms(cpus)}")
    print(
        f"  at --interval 10: {statistics.median(agents) / 10 * 100:.3f} % of one core per node, "
        f"{statistics.median(cpus) / 10 * 100:.2f} % of one core on the controller"
    )


if __name__ == "__main__":
    main()
