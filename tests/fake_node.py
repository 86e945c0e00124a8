"""A scripted node for unit tests of the lifecycle: a handler for ``MockTransport`` that answers
the node agent and the docker commands as a real node would,
and keeps what runs there, so a test can ask what is left after a rollback.

Also a one-file HTTP stand-in for rank 0 (health, models, completions) on a loopback port.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sparkfleet.config.cluster import Cluster, parse_cluster
from sparkfleet.config.recipe import load_recipe
from sparkfleet.nodes.identity import ENV_INSTANCE
from sparkfleet.nodes.transport.mock import Answer, Call, MockTransport
from sparkfleet.plan.build import plan
from sparkfleet.plan.model import Plan
from tests.json_http import JsonHandler


@dataclass
class Rank:
    """One rank as the fake node runs it."""

    rank: int
    instance: str
    pid: int
    kind: str  # "process" or "container"
    name: str = ""  # container name
    running: bool = True
    exit_code: int | None = None
    log: str = ""
    port: int | None = None
    files: dict[str, str] = field(default_factory=dict)  # log and env file, by path


@dataclass
class FakeNode:
    """What one node holds, and how it answers sparkfleet's commands."""

    name: str
    ranks: list[Rank] = field(default_factory=list)
    # Ports some other program listens on: port -> holder record as the agent reports it.
    foreign_ports: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Ranks of other instances of the deployment (as the agent's find reports them).
    foreign: list[dict[str, Any]] = field(default_factory=list)
    boot_log: str = "The server is fired up and ready to roll!\n"
    image_id: str = "sha256:" + "ab" * 32
    # Called before every answer: tests block here, or send a signal, or raise.
    on_call: Callable[[Call], None] | None = None
    fail_start: bool = False
    # What the agent's leftovers scan reports after a stop, and nvidia-smi's compute-apps CSV
    # (None: the node has no nvidia-smi); MemAvailable in bytes.
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    gpu_apps: str | None = None
    mem_available: int = 8 << 30
    _next_pid: int = 1000

    def running(self) -> list[Rank]:
        return [r for r in self.ranks if r.running]

    def __call__(self, call: Call) -> Answer:
        if self.on_call is not None:
            self.on_call(call)
        argv = call.argv
        if argv == ("true",) or argv[0] == "put":
            return 0
        if len(argv) >= 6 and argv[1:3] == ("-S", "-c"):
            return json.dumps(self._agent(argv[4], json.loads(argv[5]), call.stdin or b""))
        if argv[:2] == ("sh", "-c") and "docker stop" in argv[2]:
            for rank in self.ranks:
                if rank.kind == "container" and rank.name in argv[5:]:
                    rank.running = False
            return 0
        if argv[:2] == ("sh", "-c") and "docker logs" in argv[2]:
            return next((r.log for r in self.ranks if r.name == argv[5]), "")
        if argv[0] in ("cat", "tail"):
            for rank in self.ranks:
                if argv[-1] in rank.files:
                    return rank.files[argv[-1]]
            return 1, "", f"{argv[0]}: {argv[-1]}: No such file or directory"
        if argv[0] == "docker":
            return self._docker(argv)
        return 127, "", f"fake node: no answer for {argv[:3]}"

    def _rank_of(self, payload: dict[str, Any]) -> Rank | None:
        pid_path = payload.get("pid_path")
        match = [r for r in self.ranks if r.kind == "process" and f"r{r.rank}.pid" == Path(str(pid_path)).name]
        return match[-1] if match else None

    def _agent(self, command: str, payload: dict[str, Any], stdin: bytes) -> Any:
        if command == "preflight":
            return {"found": self._found(), "holders": self._holders(payload["ports"])}
        if command == "holders":
            return {"holders": self._holders(payload["ports"])}
        if command == "find":
            return {"found": self._found()}
        if command == "start":
            if self.fail_start:
                return {"state": "exited", "pid": None, "exit_code": 127, "started_at": None}
            self._next_pid += 1
            port = int(payload["argv"][payload["argv"].index("--port") + 1]) if payload["rank"] == 0 else None
            files = {payload["log_path"]: self.boot_log, payload["env_file"]: stdin.decode()}
            self.ranks.append(
                Rank(
                    payload["rank"],
                    payload["markers"][ENV_INSTANCE],
                    self._next_pid,
                    "process",
                    log=self.boot_log,
                    port=port,
                    files=files,
                )
            )
            return {"state": "running", "pid": self._next_pid, "exit_code": None, "started_at": 1.0}
        if command == "probe":
            rank = self._rank_of(payload)
            if rank is None:
                return {"state": "absent", "pid": None, "exit_code": None, "started_at": None, "log": ""}
            return {
                "state": "running" if rank.running else "exited",
                "pid": rank.pid,
                "exit_code": rank.exit_code,
                "started_at": 1.0,
                "log": rank.log,
            }
        if command == "stop":
            stopped = []
            for rank in self.ranks:
                if (
                    rank.kind == "process"
                    and rank.running
                    and rank.rank == payload["rank"]
                    and payload.get("instance") in (None, rank.instance)
                ):
                    rank.running = False
                    stopped.append(rank.pid)
            return {"stopped": stopped}
        if command == "watch":
            states = []
            for spec in payload["ranks"]:
                rank = self._rank_of(spec)
                states.append({"state": "absent", "pid": None, "exit_code": None, "started_at": None} if rank is None
                              else {"state": "running" if rank.running else "exited", "pid": rank.pid,
                                    "exit_code": rank.exit_code, "started_at": 1.0,
                                    "exited_at": None if rank.running else 1700000100.0})  # fmt: skip
            return {"ranks": states, "mem_available": self.mem_available, "cpu_s": 0.01}
        if command == "leftovers":
            return {
                "found": self.leftovers,
                "mem_available": self.mem_available,
                "gpu_apps": self.gpu_apps,
                "gpu_error": None if self.gpu_apps is not None else "no nvidia-smi",
            }
        raise AssertionError(f"fake node: agent command {command!r}")

    def _found(self) -> list[dict[str, Any]]:
        """The deployment's processes on the node, as the agent's find and preflight list them."""
        mine = [{"pid": r.pid, "rank": r.rank, "instance": r.instance, "owner": "me", "started": 1.0}
                for r in self.running() if r.kind == "process"]  # fmt: skip
        return self.foreign + mine

    def _holders(self, ports: list[int]) -> list[dict[str, Any]]:
        out = [self.foreign_ports[p] for p in ports if p in self.foreign_ports]
        for rank in self.running():
            if rank.port in ports:
                out.append(
                    {
                        "port": rank.port,
                        "uid": 0,
                        "pid": rank.pid,
                        "command": "engine",
                        "deployment": "x",
                        "instance": rank.instance,
                        "owner": "me",
                    }
                )
        return out

    def _docker(self, argv: tuple[str, ...]) -> Answer:
        if argv[1:3] == ("image", "inspect"):
            return self.image_id + "\n"
        if argv[1] == "run":
            labels = dict(argv[i + 1].split("=", 1) for i, w in enumerate(argv) if w == "--label")
            name = argv[argv.index("--name") + 1]
            self._next_pid += 1
            self.ranks.append(
                Rank(
                    int(labels["sparkfleet.rank"]),
                    labels["sparkfleet.instance"],
                    self._next_pid,
                    "container",
                    name=name,
                    log=self.boot_log,
                )
            )
            return f"{self._next_pid:064x}\n"
        if argv[1] == "inspect":
            rank = next((r for r in reversed(self.ranks) if r.name == argv[-1]), None)
            if rank is None:
                return 1, "", f"Error: No such object: {argv[-1]}"
            return json.dumps(
                {
                    "Running": rank.running,
                    "ExitCode": rank.exit_code or 0,
                    "StartedAt": "2026-12-01T08:00:00.000000000Z",
                }
            )
        if argv[1] == "ps":
            rows = [(r.name, "running", str(r.rank), r.instance, "me", "1", self.name)
                    for r in self.ranks if r.kind == "container" and r.running]  # fmt: skip
            return "".join("\t".join(row) + "\n" for row in rows)
        return 127, "", f"fake node: no docker answer for {argv[:3]}"


@dataclass
class FakeFleet:
    """Fake nodes, their transports and a plan over them."""

    nodes: dict[str, FakeNode]
    cluster: Cluster
    plan: Plan

    def connect(self, node: Any) -> MockTransport:
        return MockTransport(node.name, self.nodes[node.name])

    def left_running(self) -> list[tuple[str, int]]:
        return [(n.name, r.rank) for n in self.nodes.values() for r in n.running()]


def fake_fleet(tmp: Path, *, nodes: int = 2, port: int, image: str | None = None, extra: str = "",
               name: str = "fake") -> FakeFleet:  # fmt: skip
    """A recipe of the SGLang adapter over fake nodes whose rank 0 is served at 127.0.0.1:port."""
    lines = [
        'engine = "sglang"',
        'model = "org/fake"',
        f"port = {port}",
        f"rendezvous_port = {port + 1}",
        f"required_nodes = {nodes}",
        f"tensor_parallel_size = {nodes}",
        'entrypoint = ["engine"]',
    ]
    if image:
        lines.append(f'docker_image = "{image}"')
    (tmp / "recipe.toml").write_text("\n".join(lines) + "\n" + extra)
    inventory = parse_cluster({"name": "fake", "defaults": {"gpus": "none", "memlock": "none", "rdma": False},
                               "nodes": [{"name": f"node{i}", "host": "127.0.0.1"} for i in range(nodes)]},
                              "fake.toml")  # fmt: skip
    planned = plan(load_recipe(tmp / "recipe.toml"), inventory, name)
    return FakeFleet({f"node{i}": FakeNode(f"node{i}") for i in range(nodes)}, inventory, planned)


class _Head(JsonHandler):
    answer = " 42"
    on_completion: Callable[[], None] | None = None

    def do_GET(self) -> None:
        self._send({"data": [{"id": "fake"}]} if self.path == "/v1/models" else {"status": "ok"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.on_completion is not None:
            self.on_completion()
        self._send({"choices": [{"text": self.answer}]})


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away (an up rolled back by a signal mid-request) is expected here;
        # socketserver's traceback for it would land in whichever test's stderr runs next.
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


@contextmanager
def head_server(answer: str = " 42", on_completion: Callable[[], None] | None = None) -> Iterator[int]:
    """An HTTP rank 0 on a free loopback port; yields the port."""
    handler = type("Head", (_Head,), {"answer": answer, "on_completion": staticmethod(on_completion)
                                      if on_completion else None})  # fmt: skip
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
