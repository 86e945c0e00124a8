"""Which ``up`` started a rank: every deployment instance has an id and an owner. Two controllers
may both run a deployment called ``gemma``; labels and process markers carry the instance id, so
``down`` and rollback stop only their own (finding ranks by name alone is ``down --sweep``).
"""

from __future__ import annotations

import getpass
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sparkfleet.state.store import state_dir

LABEL_INSTANCE = "sparkfleet.instance"
LABEL_OWNER = "sparkfleet.owner"
LABEL_STARTED = "sparkfleet.started"
ENV_INSTANCE = "SPARKFLEET_INSTANCE"
ENV_OWNER = "SPARKFLEET_OWNER"
ENV_STARTED = "SPARKFLEET_STARTED"
# Inside containers: the process runtime's SPARKFLEET_DEPLOYMENT marker means "a host process
# the agent may signal", which a container's processes are not.
ENV_CONTAINER_NAME = "SPARKFLEET_CONTAINER_DEPLOYMENT"


def controller_owner() -> str:
    """``user@host:state_dir`` of this controller: what a refused user is told to look for."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}:{state_dir()}"


@dataclass(frozen=True)
class Instance:
    """One ``up`` of a deployment: its name, a fresh id, who started it and when."""

    deployment: str
    id: str
    owner: str
    started: float

    @classmethod
    def new(cls, deployment: str) -> Instance:
        return cls(deployment, uuid.uuid4().hex[:12], controller_owner(), time.time())

    def process_env(self) -> dict[str, str]:
        """Markers in every process of a rank (the agent adds the deployment and rank)."""
        return {ENV_INSTANCE: self.id, ENV_OWNER: self.owner, ENV_STARTED: f"{self.started:.0f}"}

    def container_env(self) -> dict[str, str]:
        """Markers inside a container, so the socket owner of its port can be told apart."""
        return {**self.process_env(), ENV_CONTAINER_NAME: self.deployment}

    def labels(self) -> tuple[str, ...]:
        """``docker run`` words that label the container with this instance."""
        return ("--label", f"{LABEL_INSTANCE}={self.id}", "--label", f"{LABEL_OWNER}={self.owner}",
                "--label", f"{LABEL_STARTED}={self.started:.0f}")  # fmt: skip


def when(epoch: float | None) -> str:
    """A start time for messages (UTC, to the second)."""
    if not epoch:
        return "unknown time"
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class FoundRank:
    """A rank of some instance of a deployment, found on a node by name."""

    node: str
    deployment: str
    kind: Literal["container", "process"]
    ident: str  # container name, or the rank's lowest pid
    running: bool
    rank: int | None = None
    instance: str | None = None
    owner: str | None = None
    started: float | None = None
    pids: tuple[int, ...] = ()

    def describe(self) -> str:
        """One line naming what it is and whose it is."""
        what = f"container {self.ident}" if self.kind == "container" else f"pid {self.ident}"
        if self.kind == "process" and len(self.pids) > 1:
            what += f" (+{len(self.pids) - 1} child process(es))"
        rank = f"rank {self.rank}, " if self.rank is not None else ""
        state = "running" if self.running else "exited"
        owner = self.owner or "an older sparkfleet (no owner recorded)"
        return (f"{self.node}: {what} ({rank}{state}; instance {self.instance or '?'}, owner {owner}, "
                f"started {when(self.started)})")  # fmt: skip


@dataclass(frozen=True)
class PortHolder:
    """A process listening on a port a rank needs."""

    port: int
    pid: int | None
    command: str
    deployment: str | None = None
    instance: str | None = None
    owner: str | None = None
    uid: int | None = None

    def describe(self) -> str:
        if self.deployment:
            return f"sparkfleet deployment {self.deployment!r} (instance {self.instance}, owner {self.owner})"
        if self.pid is None:
            return f"a process of uid {self.uid} that this user cannot inspect"
        return f"pid {self.pid} ({self.command or '?'})"
