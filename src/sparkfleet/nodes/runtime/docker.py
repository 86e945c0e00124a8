"""The docker runtime (a rank is a labelled container started with the plan's ``docker run``),
and every other docker command sparkfleet runs on a node: images, volumes, doctor's probes."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from sparkfleet.config.cluster import Node
from sparkfleet.errors import NodeError, RankRuntimeError
from sparkfleet.nodes.identity import LABEL_INSTANCE, LABEL_OWNER, LABEL_STARTED, FoundRank, Instance
from sparkfleet.nodes.runtime.base import RankState, env_file_text
from sparkfleet.nodes.transport.base import CHUNK, Result, Stream, Transport
from sparkfleet.plan.model import LABEL_DEPLOYMENT, LABEL_RANK, MountSpec, RankHandle, RankPlan

# Loopback fleets put several nodes on one dockerd: the node label keeps their ranks apart.
LABEL_NODE = "sparkfleet.node"
_FIND_FORMAT = "\t".join(
    ["{{.Names}}", "{{.State}}"]
    + [f'{{{{.Label "{label}"}}}}' for label in (LABEL_RANK, LABEL_INSTANCE, LABEL_OWNER, LABEL_STARTED, LABEL_NODE)]
)


def device_words(node: Node, shm_size: str | None = None) -> list[str]:
    """What a container needs of the node to reach its GPUs and RDMA devices, as the node's
    settings say: --gpus, the memlock limit, /dev/infiniband (and --shm-size when given)."""
    words = ["--gpus", node.gpus] if node.gpus != "none" else []
    if shm_size:
        words += ["--shm-size", shm_size]
    if node.memlock == "unlimited":
        words += ["--ulimit", "memlock=-1"]
    elif node.memlock not in (None, "none"):
        words += ["--ulimit", f"memlock={node.memlock}"]
    if node.rdma:
        words += ["--device", "/dev/infiniband"]
    return words


def docker_run_argv(
    image: str,
    shm_size: str | None,
    node: Node,
    deployment: str,
    rank: int,
    name: str,
    env_file: str,
    mounts: tuple[MountSpec, ...],
    argv: tuple[str, ...],
) -> tuple[str, ...]:
    """The ``docker run`` of one rank, as the Plan shows it (pure: plan() calls it). ``start``
    adds the instance's labels; GPUs, memlock and /dev/infiniband follow the node's settings."""
    words = [
        "docker", "run", "-d", "--name", name,
        "--label", f"{LABEL_DEPLOYMENT}={deployment}", "--label", f"{LABEL_RANK}={rank}",
        "--network", "host", "--ipc", "host",
        *device_words(node, shm_size),
    ]  # fmt: skip
    words += ["--env-file", env_file]
    for m in mounts:
        words += ["-v", f"{m.host}:{m.container}" + (":ro" if m.read_only else "")]
    words += ["--entrypoint", argv[0], image, *argv[1:]]
    return tuple(words)


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

    def inspect(self, rank: RankHandle, transport: Transport) -> RankState:
        argv = ["docker", "inspect", "--format", "{{json .State}}", rank.container_name]
        result = transport.run(argv, check=False, timeout=30)
        if not result.ok:
            if "No such" in result.stderr:
                return RankState(rank.rank, rank.node.name, "absent")
            raise RankRuntimeError(rank.node.name, f"docker inspect failed: {result.tail(3)}")
        state = json.loads(result.stdout)
        started = _epoch(state.get("StartedAt"))
        if state.get("Running"):
            return RankState(rank.rank, rank.node.name, "running", None, started, rank.container_name)
        code, ended = int(state.get("ExitCode", 0)), _epoch(state.get("FinishedAt"))
        return RankState(rank.rank, rank.node.name, "exited", code, started, rank.container_name, ended)

    def probe(self, rank: RankHandle, transport: Transport) -> tuple[RankState, str]:
        return self.inspect(rank, transport), self.logs(rank, transport, tail=None)

    def logs(self, rank: RankHandle, transport: Transport, tail: int | None = 200) -> str:
        count = str(tail) if tail else "all"
        argv = ["sh", "-c", 'docker logs --tail "$1" "$2" 2>&1', "sh", count, rank.container_name]
        result = transport.run(argv, check=False, timeout=60)
        return result.stdout if result.ok else ""

    def follow(self, rank: RankHandle, transport: Transport) -> Stream:
        return transport.stream(["docker", "logs", "--tail", "50", "-f", rank.container_name])

    def stop(self, rank: RankHandle, transport: Transport, deployment: str, instance: str | None,
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


# ---- what doctor probes: argv only (the probe bundle runs every probe in one round trip)

VERSION_ARGV = ("docker", "version", "--format", "{{json .}}")


def image_inspect_argv(ref: str, fmt: str | None = None) -> list[str]:
    """``docker image inspect`` of ref: its JSON record, or the fmt template (exit 1 when absent)."""
    return ["docker", "image", "inspect", *(["--format", fmt] if fmt else []), ref]


# ---- images on a node: inspect, pull, build, and save | load through this machine


def image_id(transport: Transport, ref: str) -> str | None:
    """The image ID ref resolves to on the node, or None when it is not there."""
    res = transport.run(image_inspect_argv(ref, "{{.Id}}"), check=False, timeout=60)
    if res.ok:
        return res.stdout.strip()
    if "no such image" in res.stderr.lower():
        return None
    raise NodeError(transport.node, f"docker is not usable: {res.tail(2)}")


def pull(transport: Transport, ref: str, *, timeout: float | None = None) -> Result:
    """``docker pull ref`` on the node (the caller reads the result)."""
    return transport.run(["docker", "pull", ref], check=False, timeout=timeout)


def ensure_image(transport: Transport, ref: str, *, on_pull: Callable[[], None] = lambda: None,
                 timeout: float = 3600) -> str | None:  # fmt: skip
    """The image ID when the node holds ref; otherwise pull it and return None. NodeError when the
    daemon cannot be reached or the pull fails."""
    have = transport.run(image_inspect_argv(ref, "{{.Id}}"), check=False, timeout=60)
    if have.ok:
        return have.stdout.strip()
    if "Cannot connect" in have.stderr or "permission denied" in have.stderr.lower():
        raise NodeError(transport.node, f"docker is not reachable: {have.tail(2)}")
    on_pull()
    pulled = pull(transport, ref, timeout=timeout)
    if not pulled.ok:
        raise NodeError(transport.node, f"image {ref} is not on the node and could not be pulled: "
                                        f"{pulled.tail(2)} (build it with `sparkfleet image build`)")  # fmt: skip
    return None


def build_image(transport: Transport, ref: str, context: bytes, dockerfile: str = "Dockerfile", *,
                no_cache: bool = False) -> str:  # fmt: skip
    """``docker build -t ref -f dockerfile -`` on the node with the context tar on stdin; the new ID."""
    # `-f Dockerfile` with a context on stdin is refused as ambiguous; the default needs no flag.
    file_flag = [] if dockerfile == "Dockerfile" else ["-f", dockerfile]
    argv = ["docker", "build", "-q", *file_flag, "-t", ref, *(["--no-cache"] if no_cache else []), "-"]
    res = transport.run(argv, stdin=context, check=False, timeout=None)
    if not res.ok:
        raise NodeError(transport.node, f"docker build of {ref} failed: {res.tail(5)}")
    return res.stdout.strip().splitlines()[-1]


def stream_image(source: Transport, ref: str, targets: Mapping[str, Transport]) -> dict[str, str]:
    """``docker save ref`` on source, fed chunk by chunk to ``docker load`` on every target at
    once (through this machine, so an image of tens of GB never sits in memory); an error message
    per target that failed (empty when all loaded)."""
    if not targets:
        return {}
    save = source.stream(["docker", "save", ref], merge_stderr=False)
    sinks = {name: t.stream(["docker", "load", "-q"], stdin=True, merge_stderr=False) for name, t in targets.items()}
    broken: dict[str, str] = {}
    while chunk := save.read(CHUNK):
        for name, sink in sinks.items():
            if name in broken:
                continue
            try:
                sink.write(chunk)
            except OSError:  # BrokenPipeError included
                broken[name] = "docker load stopped reading"
    save_rc = save.wait()
    save_err = save.errors()
    errors: dict[str, str] = {}
    for name, sink in sinks.items():
        sink.close_stdin()
        while sink.read():  # docker load -q prints a line or two
            pass
        code = sink.wait()
        if save_rc != 0:
            errors[name] = f"docker save on {source.node} failed: {save_err.strip()[-300:]}"
        elif code != 0 or name in broken:
            errors[name] = f"docker load failed: {sink.errors().strip()[-300:] or broken.get(name)}"
    return errors


# ---- volumes (the nfs staging kind's workers)


def volume_create_argv(volume: str, options: Sequence[tuple[str, str]], driver: str = "local") -> list[str]:
    """``docker volume create`` words: the driver, then one ``--opt key=value`` per option."""
    opts = [w for key, value in options for w in ("--opt", f"{key}={value}")]
    return ["docker", "volume", "create", "--driver", driver, *opts, volume]


def volume_options(transport: Transport, volume: str) -> dict[str, str] | None:
    """The driver options of a volume on the node, or None when there is no such volume."""
    seen = transport.run(["docker", "volume", "inspect", "--format", "{{json .Options}}", volume],
                         check=False, timeout=60)  # fmt: skip
    if not seen.ok:
        return None
    try:
        found = json.loads(seen.stdout)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def create_volume(transport: Transport, volume: str, options: Sequence[tuple[str, str]]) -> Result:
    """Create the volume on the node (the caller reads the result)."""
    return transport.run(volume_create_argv(volume, options), check=False, timeout=60)


def remove_volume(transport: Transport, volume: str) -> Result:
    """Remove the volume from the node (the caller reads the result)."""
    return transport.run(["docker", "volume", "rm", volume], check=False, timeout=60)


def run_once(transport: Transport, image: str, entrypoint: str, args: Sequence[str], *,
             volumes: Sequence[tuple[str, str]] = (), timeout: float = 300) -> Result:  # fmt: skip
    """A throw-away container without network: entrypoint args in image, volumes (``name``,
    ``/path:ro``) mounted; for reading a file the ranks will see."""
    mounts = [w for name, where in volumes for w in ("-v", f"{name}:{where}")]
    argv = ["docker", "run", "--rm", "--network", "none", "--entrypoint", entrypoint, *mounts, image, *args]
    return transport.run(argv, check=False, timeout=timeout)
