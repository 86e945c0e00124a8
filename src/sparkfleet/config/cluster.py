"""The cluster inventory: which nodes, how to reach them, and their per-node settings.

Node order is rank order; rank 0 is the head. Without ``--cluster`` the ``local`` cluster is
used: this machine, one node, no SSH.
"""

from __future__ import annotations

import ipaddress
import resource
import shutil
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkfleet.config import names
from sparkfleet.config.caches import local_hf_cache
from sparkfleet.config.recipe import read_toml
from sparkfleet.config.sizes import parse_size
from sparkfleet.config.validation import describe
from sparkfleet.errors import ClusterError
from sparkfleet.state.store import state_dir


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _memlock(value: str | int | None) -> str | None:
    """``unlimited``, ``none`` (no flag) or a size; anything else is an error."""
    if value is None or value in ("unlimited", "none"):
        return value
    parse_size(value)
    return str(value)


class NodeSettings(_Strict):
    """Settings a node takes from ``[defaults]`` unless it overrides them."""

    user: str | None = None
    ssh_port: int | None = Field(default=None, ge=1, le=65535)
    ssh_key: str | None = None
    ssh_config: str | None = None
    hf_cache: str | None = None
    state_dir: str | None = None
    gpus: str | None = None
    memlock: str | None = None
    rdma: bool | None = None
    fabric_ifname: str | None = None
    ib_hca: str | None = None
    ib_gid_index: int | None = Field(default=None, ge=0)
    python: str | None = None
    # Where engine servers listen: "0.0.0.0" (default), an address, or "fabric" (the node's
    # fabric_ip). Nodes that share one host (a loopback fleet) must not all take 0.0.0.0:PORT.
    bind_address: str | None = None

    @field_validator("user")
    @classmethod
    def _user_ok(cls, value: str | None) -> str | None:
        return None if value is None else names.user(value)

    @field_validator("bind_address")
    @classmethod
    def _bind_ok(cls, value: str | None) -> str | None:
        if value is None or value == "fabric":
            return value
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is neither an IP address nor 'fabric' (the node's fabric_ip)") from None
        return value

    @field_validator("memlock", mode="before")
    @classmethod
    def _memlock_ok(cls, value: str | int | None) -> str | None:
        try:
            return _memlock(value)
        except ValueError:
            raise ValueError(f"{value!r} is not 'unlimited', 'none' or a size like 64M") from None


class NodeSpec(NodeSettings):
    """One ``[[nodes]]`` entry."""

    name: str
    host: str
    fabric_ip: str | None = None
    transport: Literal["ssh", "local"] = "ssh"
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, value: str) -> str:
        return names.node_name(value)

    @field_validator("host", "fabric_ip")
    @classmethod
    def _host_ok(cls, value: str | None) -> str | None:
        return None if value is None else names.host(value)

    @field_validator("env")
    @classmethod
    def _env_ok(cls, value: dict[str, str]) -> dict[str, str]:
        return names.env(value)


class ClusterFile(_Strict):
    """The cluster.toml file as written."""

    name: str
    defaults: NodeSettings = Field(default_factory=NodeSettings)
    nodes: tuple[NodeSpec, ...] = Field(min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _unique(self) -> ClusterFile:
        seen: set[str] = set()
        for node in self.nodes:
            if node.name in seen:
                raise ValueError(f"node name {node.name!r} appears twice")
            seen.add(node.name)
        return self


class Node(BaseModel):
    """A node with its defaults applied: everything the planner needs to know about it."""

    model_config = ConfigDict(frozen=True)

    name: str
    host: str
    fabric_ip: str
    transport: Literal["ssh", "local"]
    user: str | None
    ssh_port: int | None
    ssh_key: str | None
    ssh_config: str | None
    hf_cache: str
    state_dir: str
    home: str
    gpus: str
    memlock: str | None
    rdma: bool
    fabric_ifname: str | None
    ib_hca: str | None
    ib_gid_index: int | None
    python: str
    env: dict[str, str]
    bind_address: str = "0.0.0.0"  # resolved: an address, never "fabric"

    # Checked here too: a record an older sparkfleet stored never reaches ssh's argv unchecked.
    @field_validator("host")
    @classmethod
    def _host_ok(cls, value: str) -> str:
        return names.host(value)

    @field_validator("user")
    @classmethod
    def _user_ok(cls, value: str | None) -> str | None:
        return None if value is None else names.user(value)


class Cluster(BaseModel):
    """A resolved cluster: nodes in rank order."""

    model_config = ConfigDict(frozen=True)

    name: str
    nodes: tuple[Node, ...]
    source: str

    def node(self, name: str) -> Node:
        """The node called name, or a ClusterError naming the choices."""
        for node in self.nodes:
            if node.name == name:
                return node
        names = ", ".join(n.name for n in self.nodes)
        raise ClusterError(f"{self.source}: no node named {name!r} (nodes: {names})")


def _resolve(spec: NodeSpec, defaults: NodeSettings) -> Node:
    def pick(key: str, fallback: object) -> object:
        own = getattr(spec, key)
        if own is not None:
            return own
        shared = getattr(defaults, key)
        return shared if shared is not None else fallback

    user = pick("user", None)
    home = "/root" if user == "root" else (f"/home/{user}" if user else str(Path.home()))
    hf_cache = str(pick("hf_cache", f"{home}/.cache/huggingface"))
    # A node named by its host name alone (host = "localhost" on a one-node cluster): the
    # fabric address checks and engines need an address.
    fabric_ip = spec.fabric_ip or ("127.0.0.1" if spec.host == "localhost" else spec.host)
    bind = str(pick("bind_address", "0.0.0.0"))
    return Node(
        name=spec.name,
        host=spec.host,
        fabric_ip=fabric_ip,
        transport=spec.transport,
        user=user,  # type: ignore[arg-type]
        ssh_port=pick("ssh_port", None),  # type: ignore[arg-type]
        ssh_key=pick("ssh_key", None),  # type: ignore[arg-type]
        ssh_config=pick("ssh_config", None),  # type: ignore[arg-type]
        hf_cache=hf_cache,
        state_dir=str(pick("state_dir", f"{home}/.local/state/sparkfleet")),
        home=home,
        gpus=str(pick("gpus", "all")),
        memlock=pick("memlock", "unlimited"),  # type: ignore[arg-type]
        rdma=bool(pick("rdma", True)),
        fabric_ifname=pick("fabric_ifname", None),  # type: ignore[arg-type]
        ib_hca=pick("ib_hca", None),  # type: ignore[arg-type]
        ib_gid_index=pick("ib_gid_index", None),  # type: ignore[arg-type]
        python=str(pick("python", "python3")),
        env=dict(spec.env),
        bind_address=fabric_ip if bind == "fabric" else bind,
    )


def parse_cluster(data: dict[str, object], source: str) -> Cluster:
    """Validate cluster data read from TOML; errors name ``source`` and the key path."""
    try:
        raw = ClusterFile.model_validate(data)
    except ValidationError as exc:
        raise ClusterError(f"{source}: {describe(exc, ClusterFile)}") from None
    return Cluster(name=raw.name, nodes=tuple(_resolve(n, raw.defaults) for n in raw.nodes), source=source)


def load_cluster(path: Path | str | None) -> Cluster:
    """Load a cluster file, or the ``local`` cluster when path is None."""
    if path is None:
        return local_cluster()
    file = Path(path)
    if not file.is_file():
        raise ClusterError(f"{file}: no such cluster file")
    return parse_cluster(read_toml(file, ClusterError), str(file))


def local_cluster() -> Cluster:
    """This machine as a one-node cluster, reached without SSH.

    GPUs and the memlock limit follow what this machine can do, so a CPU machine plans a
    container that Docker will accept.
    """
    home = str(Path.home())
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    memlock = "unlimited" if hard == resource.RLIM_INFINITY else "none"
    try:
        hf = str(local_hf_cache())  # the same folder scripts/prepare-model.py fills
    except ValueError as e:
        raise ClusterError(f"local cluster: {e}") from None
    node = Node(
        name="local",
        host="localhost",
        fabric_ip="127.0.0.1",
        transport="local",
        user=None,
        ssh_port=None,
        ssh_key=None,
        ssh_config=None,
        hf_cache=hf,
        state_dir=str(state_dir() / "nodes" / "local"),
        home=home,
        gpus="all" if shutil.which("nvidia-smi") else "none",
        memlock=memlock,
        rdma=Path("/sys/class/infiniband").is_dir() and any(Path("/sys/class/infiniband").iterdir()),
        fabric_ifname=None,
        ib_hca=None,
        ib_gid_index=None,
        python="python3",
        env={},
    )
    return Cluster(name="local", nodes=(node,), source="(local cluster)")
