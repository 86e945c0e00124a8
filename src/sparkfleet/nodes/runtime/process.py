"""The process runtime: a rank is a host process group that the node agent starts and watches
(the node needs only ``python3``); its environment travels in a private env file, never in argv.
"""

from __future__ import annotations

from sparkfleet.config.cluster import Node
from sparkfleet.config.secrets import TOKEN_PATTERNS
from sparkfleet.nodes.agent import node_agent
from sparkfleet.nodes.identity import FoundRank, Instance
from sparkfleet.nodes.runtime.base import RankState, env_file_text
from sparkfleet.nodes.transport.base import Stream, Transport
from sparkfleet.plan.model import RankHandle, RankPlan


def found_processes(node: str, deployment: str, entries: list[dict]) -> list[FoundRank]:
    """The agent's per-process answer grouped into one entry per instance and rank."""
    groups: dict[tuple[str | None, int | None], list[dict]] = {}
    for entry in entries:
        groups.setdefault((entry["instance"], entry["rank"]), []).append(entry)
    out = []
    for (instance, rank), members in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        pids = tuple(sorted(m["pid"] for m in members))
        out.append(FoundRank(node, deployment, "process", str(pids[0]), True, rank, instance,
                             members[0]["owner"], members[0]["started"], pids))  # fmt: skip
    return out


def _spec(rank: RankHandle, deployment: str, **extra: object) -> dict[str, object]:
    return {
        "argv": list(rank.argv), "env_file": rank.env_file, "log_path": rank.log_path,
        "pid_path": rank.pid_path, "exit_path": rank.exit_path,
        "workdir": rank.workdir, "deployment": deployment, "rank": rank.rank, "node": rank.node.name, **extra,
    }  # fmt: skip


def rank_state(rank: int, node: str, answer: dict) -> RankState:
    """A RankState from the agent's inspect, watch or probe answer for one rank."""
    exited_at = answer.get("exited_at") if answer["state"] == "exited" else None
    pid = str(answer["pid"]) if answer["pid"] else None
    return RankState(rank, node, answer["state"], answer["exit_code"], answer["started_at"], pid, exited_at)


class ProcessRuntime:
    """Ranks as host processes (CPU examples, tests, bare-metal engines)."""

    def start(self, rank: RankPlan, transport: Transport, instance: Instance) -> str:
        # Which keys are secret and what tokens look like; the values stay in the env file.
        spec = _spec(rank.handle, instance.deployment, markers=instance.process_env(),
                     secret_keys=[v.key for v in rank.env if v.secret], secret_patterns=TOKEN_PATTERNS)  # fmt: skip
        state = node_agent(transport, rank.node.python, "start", spec, timeout=30, stdin=env_file_text(rank))
        return str(state.get("pid") or "")

    def inspect(self, rank: RankHandle, transport: Transport) -> RankState:
        # watch: inspect's answer and when the rank exited (status tells a crash after ready).
        s = node_agent(transport, rank.node.python, "watch", {"ranks": [_spec(rank, "")]}, timeout=20)["ranks"][0]
        return rank_state(rank.rank, rank.node.name, s)

    def probe(self, rank: RankHandle, transport: Transport) -> tuple[RankState, str]:
        s = node_agent(transport, rank.node.python, "probe", _spec(rank, ""), timeout=20)
        return rank_state(rank.rank, rank.node.name, s), s["log"]

    def logs(self, rank: RankHandle, transport: Transport, tail: int | None = 200) -> str:
        argv = ["tail", "-n", str(tail), rank.log_path] if tail else ["cat", rank.log_path]
        result = transport.run(argv, check=False, timeout=30)
        return result.stdout if result.ok else ""

    def follow(self, rank: RankHandle, transport: Transport) -> Stream:
        return transport.stream(["tail", "-n", "50", "-F", rank.log_path])

    def stop(self, rank: RankHandle, transport: Transport, deployment: str, instance: str | None,
             grace: float = 10.0) -> list[str]:  # fmt: skip
        spec = _spec(rank, deployment, grace=grace, instance=instance)
        out = node_agent(transport, rank.node.python, "stop", spec, timeout=grace + 30)
        return [str(p) for p in out["stopped"]]

    def find(self, transport: Transport, deployment: str, node: Node) -> list[FoundRank]:
        """Every rank of any instance of deployment running as processes on the node."""
        answer = node_agent(transport, node.python, "find", {"deployment": deployment, "node": node.name},
                            timeout=30)  # fmt: skip
        return found_processes(node.name, deployment, answer["found"])

    def remove(self, transport: Transport, found: list[FoundRank], node: Node, grace: float = 10.0) -> None:
        """Stop what find returned (``down --sweep``); the agent re-checks each pid's markers."""
        for item in (f for f in found if f.kind == "process"):
            payload = {"deployment": item.deployment, "node": item.node, "pids": list(item.pids), "grace": grace}
            node_agent(transport, node.python, "kill", payload, timeout=grace + 30)
