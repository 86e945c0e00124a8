"""The process runtime: a rank is a host process group, watched by a small monitor.

The node needs only ``python3``: the agent (``process_agent.py``, stdlib only) is sent as the
``-c`` program, and the environment travels in a private env file, never in argv.
"""

from __future__ import annotations

import json
from importlib.resources import files

from sparkfleet.errors import RankRuntimeError
from sparkfleet.plan import RankPlan
from sparkfleet.runtime.base import RankState, env_file_text
from sparkfleet.transport.base import Transport

AGENT = files("sparkfleet.runtime").joinpath("process_agent.py").read_text()
# Prints "running PID STARTTICKS BTIME HZ", "exited CODE" or "absent". The pid file holds
# "PGID PID STARTTICKS"; a pid whose start time differs was reused by another process.
_INSPECT_SH = r"""
if [ -f "$2" ]; then echo exited "$(cat "$2")"; exit 0; fi
[ -r "$1" ] || { echo absent; exit 0; }
read pgid pid start < "$1"
now=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1,20)
case "$now" in
  "Z "*|"") echo exited unknown ;;
  *) [ "${now#* }" = "$start" ] && echo running "$pid" "$start" "$(sed -n 's/^btime //p' /proc/stat)" \
       "$(getconf CLK_TCK)" || echo exited unknown ;;
esac
"""


def _spec(rank: RankPlan, deployment: str, **extra: object) -> str:
    return json.dumps({
        "argv": list(rank.argv), "env_file": rank.env_file, "log_path": rank.log_path,
        "pid_path": rank.pid_path, "exit_path": rank.pid_path.removesuffix(".pid") + ".exit",
        "workdir": rank.workdir, "deployment": deployment, "rank": rank.rank, "node": rank.node.name, **extra,
    })  # fmt: skip


class ProcessRuntime:
    """Ranks as host processes (CPU examples, tests, bare-metal engines)."""

    def _agent(self, rank: RankPlan, transport: Transport, command: str, spec: str, timeout: float,
               stdin: bytes | None = None) -> dict:  # fmt: skip
        # -S: the agent needs only the standard library, and skipping site halves start-up.
        result = transport.run([rank.node.python, "-S", "-c", AGENT, command, spec], timeout=timeout,
                               check=False, stdin=stdin)  # fmt: skip
        if not result.ok:
            raise RankRuntimeError(rank.node.name, f"process agent {command} failed: {result.tail()}")
        return json.loads(result.stdout.strip().splitlines()[-1])

    def start(self, rank: RankPlan, transport: Transport, deployment: str) -> str:
        state = self._agent(rank, transport, "start", _spec(rank, deployment), 30, stdin=env_file_text(rank))
        return str(state.get("pid") or "")

    def inspect(self, rank: RankPlan, transport: Transport) -> RankState:
        # Plain sh, not the Python agent: status polls this, and a shell starts 10x faster.
        exit_path = rank.pid_path.removesuffix(".pid") + ".exit"
        result = transport.run(["sh", "-c", _INSPECT_SH, "sh", rank.pid_path, exit_path], timeout=20, check=False)
        words = result.stdout.split()
        if not result.ok or not words:
            raise RankRuntimeError(rank.node.name, f"cannot inspect rank {rank.rank}: {result.tail(3)}")
        if words[0] == "running":
            pid, ticks, btime, hz = words[1:5]
            return RankState(rank.rank, rank.node.name, "running", None, int(btime) + int(ticks) / int(hz), pid)
        if words[0] == "exited":
            code = int(words[1]) if len(words) > 1 and words[1].lstrip("-").isdigit() else None
            return RankState(rank.rank, rank.node.name, "exited", code, None, None)
        return RankState(rank.rank, rank.node.name, "absent")

    def probe(self, rank: RankPlan, transport: Transport) -> tuple[RankState, str]:
        s = self._agent(rank, transport, "probe", _spec(rank, ""), 20)
        state = RankState(rank.rank, rank.node.name, s["state"], s["exit_code"], s["started_at"],
                          str(s["pid"]) if s["pid"] else None)  # fmt: skip
        return state, s["log"]

    def logs(self, rank: RankPlan, transport: Transport, tail: int | None = 200) -> str:
        argv = ["tail", "-n", str(tail), rank.log_path] if tail else ["cat", rank.log_path]
        result = transport.run(argv, check=False, timeout=30)
        return result.stdout if result.ok else ""

    def follow_argv(self, rank: RankPlan) -> list[str]:
        return ["tail", "-n", "50", "-F", rank.log_path]

    def stop(self, rank: RankPlan, transport: Transport, deployment: str, grace: float = 10.0) -> list[str]:
        out = self._agent(rank, transport, "stop", _spec(rank, deployment, grace=grace), grace + 30)
        return [str(p) for p in out["stopped"]]

    def find(self, transport: Transport, deployment: str, node: str, python: str = "python3") -> list[str]:
        """Pids of every process on the node that belongs to deployment."""
        spec = json.dumps({"deployment": deployment, "node": node})
        result = transport.run([python, "-S", "-c", AGENT, "find", spec], check=False, timeout=20)
        return [str(p) for p in json.loads(result.stdout or '{"pids": []}')["pids"]] if result.ok else []

