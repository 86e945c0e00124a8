"""Docker: `docker version --format '{{json .}}'` and `docker image inspect REF`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from sparkfleet.doctor.probes.bundle import ProbeOutput
from sparkfleet.doctor.probes.fact import Asked, Fact, fixed, section
from sparkfleet.nodes.runtime.docker import VERSION_ARGV, image_inspect_argv

# The commands are the docker runtime's; the parsers below are this probe's.
VERSION_COMMAND = list(VERSION_ARGV)


def image_command(ref: str) -> list[str]:
    """The argv that prints the image's JSON record (exit 1 when absent)."""
    return image_inspect_argv(ref)


@dataclass(frozen=True)
class DockerFacts:
    """Client and daemon versions; `server` is empty when the daemon did not answer."""

    installed: bool
    client: str
    server: str
    error: str

    @property
    def reachable(self) -> bool:
        return bool(self.server)


@dataclass(frozen=True)
class ImageFacts:
    """An image on one node: `id` is empty when it is not there."""

    ref: str
    id: str
    repo_digests: tuple[str, ...]
    created: str

    @property
    def present(self) -> bool:
        return bool(self.id)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def parse_version(stdout: str, exit_code: int, stderr: str = "") -> DockerFacts:
    """Parse `VERSION_COMMAND`; it prints the client half and exits 1 when the daemon is down."""
    if exit_code == 127:
        return DockerFacts(installed=False, client="", server="", error="docker not installed")
    client = server = ""
    text = stdout.strip()
    if text.startswith("{"):
        data = json.loads(text.splitlines()[0])
        client = (data.get("Client") or {}).get("Version", "")
        server = (data.get("Server") or {}).get("Version", "") if data.get("Server") else ""
    error = "" if server else _last_line(stderr) or "docker daemon did not answer"
    return DockerFacts(installed=True, client=client, server=server, error=error)


def parse_image(ref: str, stdout: str, exit_code: int) -> ImageFacts:
    """Parse `image_command(ref)`; a missing image gives an ImageFacts without id."""
    if exit_code != 0:
        return ImageFacts(ref=ref, id="", repo_digests=(), created="")
    records = json.loads(stdout or "[]")
    if not records:
        return ImageFacts(ref=ref, id="", repo_digests=(), created="")
    rec = records[0]
    return ImageFacts(
        ref=ref,
        id=rec.get("Id", ""),
        repo_digests=tuple(rec.get("RepoDigests") or ()),
        created=rec.get("Created", ""),
    )


DOCKER = fixed("docker", VERSION_COMMAND, lambda out: parse_version(out.stdout, out.exit_code, out.stderr))


def _parse_asked_image(outs: Mapping[str, ProbeOutput], asked: Asked) -> ImageFacts:
    out = section(outs, "image")
    return parse_image(asked.req.image or "", out.stdout, out.exit_code)


IMAGE = Fact("image", lambda req: {"image": image_command(req.image)} if req.image else {}, _parse_asked_image)
# dockerd enables `--gpus` only when this hook is on its PATH (nvidia-container-toolkit).
GPU_HOOK = fixed(
    "gpu_hook", ["sh", "-c", "command -v nvidia-container-runtime-hook"], lambda out: out.ok, run_as="gpuhook"
)
