"""The docker runtime: a rank is a labelled container started with the plan's ``docker run``."""

from __future__ import annotations

import json
from datetime import datetime

from sparkfleet.errors import RankRuntimeError
from sparkfleet.plan import LABEL_DEPLOYMENT, RankPlan
from sparkfleet.runtime.base import RankState, env_file_text
from sparkfleet.transport.base import Transport


def _epoch(stamp: str | None) -> float | None:
    if not stamp or stamp.startswith("0001-"):
        return None
    # Docker prints nanoseconds; Python reads at most microseconds.
    head, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()


class DockerRuntime:
    """Ranks as containers; found again by their labels even when local state is lost."""

    def start(self, rank: RankPlan, transport: Transport, deployment: str) -> str:
        assert rank.container_argv is not None
        transport.put_bytes(env_file_text(rank), rank.env_file, mode=0o600)
        # A container left from an earlier failed start would block the name.
        transport.run(["docker", "rm", "-f", rank.container_name], check=False, timeout=60)
        result = transport.run(list(rank.container_argv), check=False, timeout=300)
        if not result.ok:
            raise RankRuntimeError(rank.node.name, f"docker run for rank {rank.rank} failed: {result.tail(5)}")
        return result.stdout.strip()[:12]

    def inspect(self, rank: RankPlan, transport: Transport) -> RankState:
        result = transport.run(
            ["docker", "inspect", "--format", "{{json .State}}", rank.container_name], check=False, timeout=30
        )
        if not result.ok:
            if "No such" in result.stderr:
                return RankState(rank.rank, rank.node.name, "absent")
            raise RankRuntimeError(rank.node.name, f"docker inspect failed: {result.tail(3)}")
        state = json.loads(result.stdout)
        running = bool(state.get("Running"))
        return RankState(
            rank.rank,
            rank.node.name,
            "running" if running else "exited",
            None if running else int(state.get("ExitCode", 0)),
            _epoch(state.get("StartedAt")),
            rank.container_name,
        )

    def probe(self, rank: RankPlan, transport: Transport) -> tuple[RankState, str]:
        return self.inspect(rank, transport), self.logs(rank, transport, tail=None)

    def logs(self, rank: RankPlan, transport: Transport, tail: int | None = 200) -> str:
        count = str(tail) if tail else "all"
        result = transport.run(
            ["sh", "-c", 'docker logs --tail "$1" "$2" 2>&1', "sh", count, rank.container_name],
            check=False,
            timeout=60,
        )
        return result.stdout if result.ok else ""

    def follow_argv(self, rank: RankPlan) -> list[str]:
        return ["docker", "logs", "--tail", "50", "-f", rank.container_name]

    def stop(self, rank: RankPlan, transport: Transport, deployment: str, grace: float = 10.0) -> list[str]:
        names = self.find(transport, deployment, rank.rank)
        if rank.container_name not in names:
            names.append(rank.container_name)
        transport.run(["docker", "stop", "-t", str(int(grace)), *names], check=False, timeout=grace + 60)
        transport.run(["docker", "rm", "-f", *names], check=False, timeout=60)
        return names

    def find(self, transport: Transport, deployment: str, rank: int | None = None) -> list[str]:
        """Names of every container labelled with deployment (and rank) on the node."""
        argv = ["docker", "ps", "-a", "--format", "{{.Names}}", "--filter", f"label={LABEL_DEPLOYMENT}={deployment}"]
        if rank is not None:
            argv += ["--filter", f"label=sparkfleet.rank={rank}"]
        result = transport.run(argv, check=False, timeout=30)
        return result.stdout.split() if result.ok else []
