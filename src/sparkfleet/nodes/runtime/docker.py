"""The docker runtime: a rank is a labelled container started with the plan's ``docker run``."""

from __future__ import annotations

import json
from datetime import datetime

from sparkfleet.errors import RankRuntimeError
from sparkfleet.nodes.identity import LABEL_INSTANCE, LABEL_OWNER, LABEL_STARTED, FoundRank, Instance
from sparkfleet.nodes.runtime.base import RankState, env_file_text
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.plan.model import LABEL_DEPLOYMENT, LABEL_RANK, RankPlan
from sparkfleet.spec.cluster import Node

# Loopback fleets put several nodes on one dockerd: the node label keeps their ranks apart.
LABEL_NODE = "sparkfleet.node"
_FIND_FORMAT = "\t".join(["{{.Names}}", "{{.State}}"] + [
    f'{{{{.Label "{label}"}}}}' for label in (LABEL_RANK, LABEL_INSTANCE, LABEL_OWNER, LABEL_STARTED, LABEL_NODE)
])


def _epoch(stamp: str | None) -> float | None:
    if not stamp or stamp.startswith("0001-"):
        return None
    # Docker prints nanoseconds; Python reads at most microseconds.
    head, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()


class DockerRuntime:
    """Ranks as containers; found again by their labels even when local state is lost."""

    def start(self, rank: RankPlan, transport: Transport, instance: Instance) -> str:
        assert rank.container_argv is not None
        markers = "".join(f"{k}={v}\n" for k, v in instance.container_env().items()).encode()
        transport.put_bytes(env_file_text(rank) + markers, rank.env_file, mode=0o600)
        # No `docker rm -f` of a same-named container first: up's preflight refused to start if
        # one exists, since it belongs to another instance (maybe another user's).
        argv = list(rank.container_argv)
        at = argv.index("run") + 1
        argv[at:at] = [*instance.labels(), "--label", f"{LABEL_NODE}={rank.node.name}"]
        result = transport.run(argv, check=False, timeout=300)
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

    def stop(self, rank: RankPlan, transport: Transport, deployment: str, instance: str | None,
             grace: float = 10.0) -> list[str]:  # fmt: skip
        names = [f.ident for f in self.find(transport, deployment, rank.node)
                 if f.rank == rank.rank and (instance is None or f.instance == instance)]  # fmt: skip
        if instance is None and rank.container_name not in names:
            names.append(rank.container_name)  # a record from before instance ids
        _stop_and_remove(transport, names, grace)
        return names

    def find(self, transport: Transport, deployment: str, node: Node) -> list[FoundRank]:
        """Every container of any instance of deployment on the node (any state)."""
        argv = ["docker", "ps", "-a", "--no-trunc", "--format", _FIND_FORMAT,
                "--filter", f"label={LABEL_DEPLOYMENT}={deployment}"]  # fmt: skip
        result = transport.run(argv, check=False, timeout=30)
        if not result.ok:
            if "command not found" in result.stderr or result.exit_code == 127:
                return []
            raise RankRuntimeError(node.name, f"docker ps failed: {result.tail(3)}")
        out = []
        for line in result.stdout.splitlines():
            name, state, rank, instance, owner, started, on_node = (line.split("\t") + [""] * 7)[:7]
            if on_node and on_node != node.name:
                continue
            out.append(FoundRank(node.name, deployment, "container", name, state == "running",
                                 int(rank) if rank.isdigit() else None, instance or None, owner or None,
                                 float(started) if started.isdigit() else None))  # fmt: skip
        return out

    def remove(self, transport: Transport, found: list[FoundRank], node: Node, grace: float = 10.0) -> None:
        """Stop and remove what find returned (``down --sweep``)."""
        _stop_and_remove(transport, [f.ident for f in found if f.kind == "container"], grace)


def _stop_and_remove(transport: Transport, names: list[str], grace: float) -> None:
    """One round trip: stop with the grace period, then remove (also what never started)."""
    if names:
        script = 'g="$1"; shift; docker stop -t "$g" "$@" >/dev/null 2>&1; docker rm -f "$@" >/dev/null 2>&1; true'
        transport.run(["sh", "-c", script, "sh", str(int(grace)), *names], check=False, timeout=grace + 90)
