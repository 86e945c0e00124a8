"""Everything doctor needs to know about one node, gathered in one round trip.

`FactsRequest` says what to ask (which image, which staging paths, which peers to try); the
node answers one bundled shell script; `parse_facts` turns the framed outputs into NodeFacts.
A probe that failed or printed something unexpected leaves its field None and an entry in
`errors`, so one odd node never hides the others' results.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkfleet.doctor.probes import (
    clock,
    disk,
    docker,
    gpu,
    limits,
    meminfo,
    netif,
    ports,
    rdma,
    reach,
    snapshot,
    user,
)
from sparkfleet.doctor.probes.bundle import ProbeOutput, run_bundle
from sparkfleet.doctor.probes.clock import Skew
from sparkfleet.doctor.probes.disk import DiskFree
from sparkfleet.doctor.probes.docker import DockerFacts, ImageFacts
from sparkfleet.doctor.probes.gpu import GpuFacts
from sparkfleet.doctor.probes.limits import MemlockLimit
from sparkfleet.doctor.probes.meminfo import MemInfo
from sparkfleet.doctor.probes.netif import NetFacts
from sparkfleet.doctor.probes.ports import ListeningPorts
from sparkfleet.doctor.probes.rdma import RdmaFacts
from sparkfleet.doctor.probes.reach import Reach
from sparkfleet.doctor.probes.snapshot import Snapshot
from sparkfleet.errors import SparkfleetError, TransportTimeout
from sparkfleet.nodes.shipped.safetensors_index import header_tensors, tensor_nbytes
from sparkfleet.nodes.transport.base import Transport


@dataclass(frozen=True)
class FactsRequest:
    """What to probe on one node beyond the fixed set."""

    image: str | None = None
    disk_paths: tuple[str, ...] = ()
    hf_cache: str | None = None
    model_repo: str | None = None
    reach_targets: tuple[tuple[str, int], ...] = ()
    checkpoint_headers: bool = False


@dataclass(frozen=True)
class NodeFacts:
    """One node's facts; `reachable` False means nothing else could be asked."""

    node: str
    reachable: bool
    error: str = ""
    elapsed: float = 0.0
    user: str | None = None
    skew: Skew | None = None
    meminfo: MemInfo | None = None
    gpu: GpuFacts | None = None
    rdma: RdmaFacts | None = None
    net: NetFacts | None = None
    docker: DockerFacts | None = None
    image: ImageFacts | None = None
    disks: tuple[tuple[str, DiskFree | None], ...] = ()
    ports: ListeningPorts | None = None
    snapshots: tuple[Snapshot, ...] | None = None
    reach: tuple[Reach, ...] = ()
    memlock: MemlockLimit | None = None
    gpu_hook: bool | None = None
    model_config: dict[str, Any] | None = None
    tensors: dict[str, int] | None = None
    errors: tuple[str, ...] = field(default=())


def checkpoint_command(hf_cache: str, repo: str) -> list[str]:
    """config.json and every safetensors header (8-byte LE length, then JSON) of the newest
    snapshot revision, framed as `## config` / `## header NAME LENGTH` sections."""
    script = (
        'd=$(ls -1dt "$1"/*/ 2>/dev/null | head -n 1); [ -n "$d" ] || exit 0; '
        'echo "## config"; cat "$d/config.json" 2>/dev/null; echo; '
        'for f in "$d"*.safetensors; do [ -f "$f" ] || continue; '
        'n=$(od -An -t u8 -N 8 "$f" | tr -d " "); echo "## header $(basename "$f") $n"; '
        'tail -c +9 "$f" | head -c "$n"; echo; done'
    )
    return ["sh", "-c", script, "checkpoint", snapshot.snapshots_dir(hf_cache, repo)]


def parse_checkpoint(stdout: str) -> tuple[dict[str, Any] | None, dict[str, int] | None]:
    """(model config, tensor name → bytes) from `checkpoint_command` output."""
    config: dict[str, Any] | None = None
    tensors: dict[str, int] = {}
    for section in re.split(r"(?m)^## ", stdout)[1:]:
        head, _, body = section.partition("\n")
        if head == "config" and body.strip():
            config = json.loads(body)
        elif head.startswith("header "):
            tensors.update(tensor_nbytes(header_tensors(body)))
    return config, (tensors or None)


def probe_commands(req: FactsRequest) -> dict[str, list[str]]:
    """The named probe commands for one node."""
    cmds: dict[str, list[str]] = {
        "user": user.COMMAND,
        "clock": clock.COMMAND,
        "meminfo": meminfo.COMMAND,
        "gpu": gpu.GPU_COMMAND,
        "gpuapps": gpu.APPS_COMMAND,
        "rdma": rdma.command(),
        "netif": netif.command(),
        "docker": docker.VERSION_COMMAND,
        "ports": ports.COMMAND,
        "memlock": limits.COMMAND,
        # dockerd enables `--gpus` only when this hook is on its PATH (nvidia-container-toolkit).
        "gpuhook": ["sh", "-c", "command -v nvidia-container-runtime-hook"],
    }
    if req.image:
        cmds["image"] = docker.image_command(req.image)
    for i, path in enumerate(req.disk_paths):
        cmds[f"disk{i}"] = disk.command(path)
    if req.hf_cache and req.model_repo:
        cmds["snapshot"] = snapshot.command(req.hf_cache, req.model_repo)
        if req.checkpoint_headers:
            cmds["checkpoint"] = checkpoint_command(req.hf_cache, req.model_repo)
    if req.reach_targets:
        cmds["reach"] = reach.command(req.reach_targets)
    return cmds


def _parsed(outs: dict[str, ProbeOutput], name: str, parse: Callable[[ProbeOutput], Any], errors: list[str]) -> Any:
    out = outs.get(name)
    if out is None:
        errors.append(f"{name}: no output")
        return None
    try:
        return parse(out)
    except (ValueError, KeyError, IndexError, json.JSONDecodeError) as exc:
        errors.append(f"{name}: unexpected output ({exc}): {(out.stderr or out.stdout).strip()[:200]}")
        return None


def parse_facts(node: str, outs: dict[str, ProbeOutput], req: FactsRequest, sent: float, received: float) -> NodeFacts:
    """NodeFacts from the bundle's outputs (pure)."""
    errors: list[str] = []
    remote_clock = _parsed(outs, "clock", lambda o: clock.parse(o.stdout), errors)
    disks = tuple(
        (path, _parsed(outs, f"disk{i}", lambda o: disk.parse(o.stdout), errors))
        for i, path in enumerate(req.disk_paths)
    )
    config, tensors = None, None
    if "checkpoint" in outs:
        config, tensors = _parsed(outs, "checkpoint", lambda o: parse_checkpoint(o.stdout), errors) or (
            None,
            None,
        )
    return NodeFacts(
        node=node,
        reachable=True,
        elapsed=received - sent,
        user=_parsed(outs, "user", lambda o: user.parse(o.stdout), errors),
        skew=clock.skew(remote_clock, sent, received) if remote_clock is not None else None,
        meminfo=_parsed(outs, "meminfo", lambda o: meminfo.parse(o.stdout), errors),
        gpu=_parsed(
            outs,
            "gpu",
            lambda o: gpu.parse(o.stdout, o.exit_code, outs["gpuapps"].stdout if "gpuapps" in outs else "", o.stderr),
            errors,
        ),
        rdma=_parsed(outs, "rdma", lambda o: rdma.parse(o.stdout), errors),
        net=_parsed(outs, "netif", lambda o: netif.parse(o.stdout), errors),
        docker=_parsed(outs, "docker", lambda o: docker.parse_version(o.stdout, o.exit_code, o.stderr), errors),
        image=(
            _parsed(outs, "image", lambda o: docker.parse_image(req.image or "", o.stdout, o.exit_code), errors)
            if req.image
            else None
        ),
        disks=disks,
        ports=_parsed(outs, "ports", lambda o: ports.parse(o.stdout), errors),
        snapshots=_parsed(outs, "snapshot", lambda o: snapshot.parse(o.stdout), errors) if "snapshot" in outs else None,
        reach=_parsed(outs, "reach", lambda o: reach.parse(o.stdout, req.reach_targets, o.exit_code, o.stderr), errors)
        or ()
        if "reach" in outs
        else (),
        memlock=_parsed(outs, "memlock", lambda o: limits.parse(o.stdout), errors),
        gpu_hook=outs["gpuhook"].ok if "gpuhook" in outs else None,
        model_config=config,
        tensors=tensors,
        errors=tuple(errors),
    )


def collect(transport: Transport, req: FactsRequest, *, timeout: float = 20.0) -> NodeFacts:
    """Run every probe on the transport's node in one round trip; an unreachable node gives
    NodeFacts(reachable=False) with the transport's message."""
    sent = time.time()
    try:
        result, outs = run_bundle(transport, probe_commands(req), timeout=timeout)
    except SparkfleetError as exc:
        detail = getattr(exc, "detail", None) or exc.message
        if isinstance(exc, TransportTimeout):  # its message quotes the whole probe script: say it short
            detail = f"no answer within {timeout:g} s from {exc.where} (node hung or overloaded)"
        return NodeFacts(node=transport.node, reachable=False, error=detail, elapsed=time.time() - sent)
    received = time.time()
    if not outs:
        why = result.tail() or f"exit {result.exit_code}"
        return NodeFacts(node=transport.node, reachable=False, error=f"probe script failed: {why}")
    return parse_facts(transport.node, outs, req, sent, received)
