"""Orchestration overhead of up / status / down on a 4-node loopback fleet (Bar: up ≤ 2 s,
status ≤ 0.5 s, down ≤ 2 s), with a stand-in rank that is ready at once.

Each node is a real sshd on its own 127.0.0.x address; the CLI runs as a user would
(`sparkfleet up|status|down`, wall time of the whole command, Python start-up included).

The nodes' login user is a dedicated account with a plain /bin/sh: on this test machine root's
~/.bashrc runs `pyenv init`, which adds ~0.3 s to every SSH command (bash sources ~/.bashrc for
ssh sessions). That cost belongs to the machine, not to sparkfleet; the figures for root are
printed too, for comparison. Run as root.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fleet import loopback_fleet  # noqa: E402

USER = "sparkfleet-bench"
ROUNDS = 5
BARS = {"up": 2.0, "status": 0.5, "down": 2.0}


def ensure_user() -> None:
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", USER], check=True)
    # sshd (without PAM) refuses accounts whose password field is locked ("!").
    subprocess.run(["usermod", "-p", "*", USER], check=True)


def cli(*args: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([shutil.which("sparkfleet") or "sparkfleet", *args], capture_output=True, text=True,
                          env=env)  # fmt: skip
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"sparkfleet {' '.join(args)} failed:\n{proc.stderr}")
    return elapsed


def measure(user: str | None, label: str) -> dict[str, list[float]]:
    work = Path(tempfile.mkdtemp(prefix="sfbench"))
    work.chmod(0o755)
    standin = work / "standin_engine.py"
    shutil.copy(ROOT / "tests" / "standin_engine.py", standin)
    standin.chmod(0o644)
    recipe = work / "bench4"
    recipe.mkdir()
    python = "/usr/bin/python3" if user else sys.executable
    (recipe / "recipe.toml").write_text(
        'engine = "sglang"\nmodel = "org/standin"\nport = 18950\nrendezvous_port = 18951\n'
        f'required_nodes = 4\ntensor_parallel_size = 4\nentrypoint = ["{python}", "{standin}"]\n'
    )
    env = {**os.environ, "SPARKFLEET_STATE_DIR": str(work / "controller-state")}
    times: dict[str, list[float]] = {"up": [], "status": [], "down": []}
    with loopback_fleet(4, work / "fleet", user=user, first_octet=60) as fleet:
        if user:
            fleet.authorized_keys.chmod(0o644)
            for node in fleet.nodes:
                shutil.chown(node.state_dir, user)
                shutil.chown(node.hf_cache, user)
            for path in (fleet.workdir, fleet.workdir / "hf", fleet.workdir / "state"):
                if path.exists():
                    path.chmod(0o755)
        cluster = str(fleet.cluster_file)
        cli("up", str(recipe), "--cluster", cluster, env=env)  # warm-up: opens the SSH masters
        cli("down", "bench4", env=env)
        for _ in range(ROUNDS):
            times["up"].append(cli("up", str(recipe), "--cluster", cluster, env=env))
            times["status"].append(cli("status", "bench4", env=env))
            times["down"].append(cli("down", "bench4", env=env))
    shutil.rmtree(work, ignore_errors=True)
    print(f"\n{label}:")
    for op, values in times.items():
        print(f"  {op:<6} median {statistics.median(values):.2f} s  min {min(values):.2f}  max {max(values):.2f}"
              f"  (bar ≤ {BARS[op]} s)")  # fmt: skip
    return times


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("run as root (it creates the benchmark's node user and binds sshd to port 22)")
    ensure_user()
    load = os.getloadavg()[0]
    print(f"4-node loopback fleet, stand-in ranks, {ROUNDS} rounds; load average {load:.1f} on {os.cpu_count()} cores")
    lean = measure(USER, f"nodes log in as {USER} (plain /bin/sh)")
    measure(None, "nodes log in as root (this machine's ~/.bashrc runs pyenv init on every SSH command)")
    ok = all(statistics.median(lean[op]) <= bar for op, bar in BARS.items())
    print(f"\nbar (lean login shell): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
