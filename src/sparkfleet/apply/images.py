"""Container images on every node: build from the recipe's `docker_image_dir`, distribute with
`docker save | docker load`, and make sure every node runs the same image ID.

- build, default: the build context is tarred here and piped to `docker build -` on the head
  (no copy of the directory needs to exist on any node), then streamed to every node whose
  image ID differs. `on_each_node`: the same context is built on every node in parallel
  (like the seeds' launchers), which may give different IDs; `verify_same_id` reports that.
- push: stream the image the head (or `source`) holds to every node whose ID differs.
- Nodes whose ID already matches are skipped. A pinned reference (`repo@sha256:…`) names a
  registry manifest that neither a build nor a `docker load` can reproduce, so it is never
  built or streamed: nodes that lack it pull it, and anything else is refused.

Bytes flow source → this machine → targets through pipes, one chunk at a time, so an image
of tens of GB never sits in memory.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import subprocess
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkfleet.errors import NodeError, RecipeError
from sparkfleet.nodes.transport.base import Transport
from sparkfleet.nodes.transport.ssh import SshTransport

if TYPE_CHECKING:
    from sparkfleet.plan.build import Plan

CHUNK = 1 << 20
Progress = Callable[[str, str], None]


@dataclass(frozen=True)
class ImageAction:
    """What happened to the image on one node."""

    node: str
    action: str  # "skipped" | "built" | "loaded" | "pulled" | "failed"
    image_id: str | None
    detail: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.action != "failed"


def is_pinned(ref: str) -> bool:
    """`repo@sha256:…`: a registry manifest digest."""
    return "@sha256:" in ref


def image_id(transport: Transport, ref: str) -> str | None:
    """The image ID `ref` resolves to on the node, or None when it is not there."""
    res = transport.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], check=False, timeout=60)
    if res.ok:
        return res.stdout.strip()
    if "no such image" in res.stderr.lower():
        return None
    raise NodeError(transport.node, f"docker is not usable: {res.tail(2)}")


def image_ids(transports: Mapping[str, Transport], ref: str) -> dict[str, str | None]:
    """image_id on every node, in parallel."""
    names = list(transports)
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        return dict(zip(names, pool.map(lambda n: image_id(transports[n], ref), names), strict=True))


def verify_same_id(
    transports: Mapping[str, Transport], ref: str, *, allow_mismatch: bool = False
) -> dict[str, str]:
    """The image ID of every node; NodeError naming the nodes that lack the image or differ
    from the first node (unless allow_mismatch, for a deliberate mixed fleet)."""
    ids = image_ids(transports, ref)
    missing = [n for n, i in ids.items() if i is None]
    if missing:
        first = missing[0]
        raise NodeError(first, f"image {ref} is not on {', '.join(missing)} (sparkfleet image build|push)")
    head = next(iter(ids))
    differ = [f"{n} {i[7:19]}" for n, i in ids.items() if i != ids[head]]  # type: ignore[index]
    if differ and not allow_mismatch:
        raise NodeError(
            head,
            f"image {ref} differs across nodes ({head} {ids[head][7:19]}; {', '.join(differ)}): "  # type: ignore[index]
            "run `sparkfleet image push` to give every node the head's image",
        )
    return {n: i for n, i in ids.items() if i is not None}


def resolve_context(recipe_source: str, image_dir: str) -> Path:
    """The build context `docker_image_dir` names: absolute, or relative to the recipe's
    folder, to a `docker-images/` folder beside it or above it, or to the working directory."""
    given = Path(image_dir).expanduser()
    if given.is_absolute():
        candidates = [given]
    else:
        base = Path(recipe_source).resolve()
        base = base.parent if base.is_file() or base.suffix == ".toml" else base
        candidates = [base / given] + [p / "docker-images" / given for p in (base, *base.parents)]
        candidates.append(Path.cwd() / given)
    for path in candidates:
        if path.is_dir():
            return path
    raise RecipeError(
        f"{recipe_source}: docker_image_dir = {image_dir!r}: no such folder (looked in {candidates[0]})"
    )


def context_tar(context: Path) -> bytes:
    """The build context as an uncompressed tar, the way `docker build -` reads it from stdin.
    Paths listed in .dockerignore (simple patterns) are left out."""
    ignore = []
    if (context / ".dockerignore").is_file():
        ignore = [
            line.strip().rstrip("/")
            for line in (context / ".dockerignore").read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
    buf = io.BytesIO()
    # GNU format: docker sniffs stdin for a plain tar header and takes a PAX one for a Dockerfile.
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(context.rglob("*")):
            rel = path.relative_to(context).as_posix()
            if any(Path(rel).match(p) or rel == p or rel.startswith(p + "/") for p in ignore):
                continue
            tar.add(path, arcname=rel, recursive=False)
    return buf.getvalue()


def build_on(
    transport: Transport, ref: str, context: bytes, dockerfile: str = "Dockerfile", *, no_cache: bool = False
) -> str:
    """`docker build -t ref -f dockerfile -` on the node with the context on stdin; the new ID."""
    # `-f Dockerfile` with a context on stdin is refused as ambiguous; the default needs no flag.
    file_flag = [] if dockerfile == "Dockerfile" else ["-f", dockerfile]
    argv = ["docker", "build", "-q", *file_flag, "-t", ref, *(["--no-cache"] if no_cache else []), "-"]
    res = transport.run(argv, stdin=context, check=False, timeout=None)
    if not res.ok:
        raise NodeError(transport.node, f"docker build of {ref} failed: {res.tail(5)}")
    return res.stdout.strip().splitlines()[-1]


def _local_argv(transport: Transport, argv: Sequence[str]) -> list[str]:
    """The command to run here that runs argv on the transport's node with plain pipes."""
    if isinstance(transport, SshTransport):
        return [*transport.ssh_argv(), "--", shlex.join(argv)]
    return list(argv)


def stream_image(source: Transport, ref: str, targets: Mapping[str, Transport]) -> dict[str, str]:
    """`docker save ref` on source, fed chunk by chunk to `docker load` on every target at
    once; returns an error message per target that failed (empty when all loaded)."""
    if not targets:
        return {}
    save = subprocess.Popen(
        _local_argv(source, ["docker", "save", ref]), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    sinks = {
        name: subprocess.Popen(
            _local_argv(t, ["docker", "load", "-q"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name, t in targets.items()
    }
    broken: dict[str, str] = {}
    assert save.stdout is not None
    while chunk := save.stdout.read(CHUNK):
        for name, sink in sinks.items():
            if name in broken:
                continue
            try:
                sink.stdin.write(chunk)  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                broken[name] = "docker load stopped reading"
    save_err = save.stderr.read().decode(errors="replace") if save.stderr else ""
    save_rc = save.wait()
    errors: dict[str, str] = {}
    for name, sink in sinks.items():
        with contextlib.suppress(OSError):
            sink.stdin.close()  # type: ignore[union-attr]
        # docker load -q prints a line or two: reading one stream after the other cannot block.
        sink.stdout.read()  # type: ignore[union-attr]
        err = sink.stderr.read()  # type: ignore[union-attr]
        sink.wait()
        if save_rc != 0:
            errors[name] = f"docker save on {source.node} failed: {save_err.strip()[-300:]}"
        elif sink.returncode != 0 or name in broken:
            errors[name] = (
                f"docker load failed: {err.decode(errors='replace').strip()[-300:] or broken.get(name)}"
            )
    return errors


def _timed(node: str, fn: Callable[[], tuple[str, str | None, str]]) -> ImageAction:
    start = time.monotonic()
    try:
        action, iid, detail = fn()
    except NodeError as exc:
        return ImageAction(node, "failed", None, exc.detail, time.monotonic() - start)
    return ImageAction(node, action, iid, detail, time.monotonic() - start)


def distribute(
    ref: str, source: str, transports: Mapping[str, Transport], *, progress: Progress | None = None
) -> list[ImageAction]:
    """Give every node the image `source` holds: skip nodes with the same ID, stream to the rest
    (pinned references are pulled instead), then check what arrived."""
    say = progress or (lambda _n, _m: None)
    start = time.monotonic()
    want = image_id(transports[source], ref)
    if want is None:
        how = "docker pull it there" if is_pinned(ref) else "build it first (sparkfleet image build)"
        raise NodeError(source, f"image {ref} is not on {source}: {how}")
    have = image_ids({n: t for n, t in transports.items() if n != source}, ref)
    actions = [ImageAction(source, "skipped", want, "source", 0.0)]
    todo = {n: transports[n] for n, i in have.items() if i != want}
    actions += [
        ImageAction(n, "skipped", i, "same image ID already", 0.0) for n, i in have.items() if i == want
    ]
    if not todo:
        return actions
    if is_pinned(ref):
        for name in todo:
            say(name, f"pulling pinned {ref}")

        def pull(name: str) -> ImageAction:
            res = todo[name].run(["docker", "pull", ref], check=False, timeout=None)
            if not res.ok:
                return ImageAction(name, "failed", None, f"docker pull {ref}: {res.tail(2)}", 0.0)
            got = image_id(todo[name], ref)
            ok = got == want
            detail = "pulled" if ok else f"pulled {got}, but {source} has {want}"
            return ImageAction(name, "pulled" if ok else "failed", got, detail, 0.0)

        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            return actions + list(pool.map(pull, todo))
    say(",".join(todo), f"streaming {ref} from {source}")
    errors = stream_image(transports[source], ref, todo)
    elapsed = time.monotonic() - start
    for name, t in todo.items():
        if name in errors:
            actions.append(ImageAction(name, "failed", None, errors[name], elapsed))
            continue
        got = image_id(t, ref)
        if got == want:
            actions.append(ImageAction(name, "loaded", got, f"streamed from {source}", elapsed))
        else:
            actions.append(ImageAction(name, "failed", got, f"loaded {got}, expected {want}", elapsed))
    return actions


def build(
    ref: str,
    context: Path,
    transports: Mapping[str, Transport],
    head: str,
    *,
    dockerfile: str = "Dockerfile",
    on_each_node: bool = False,
    no_cache: bool = False,
    progress: Progress | None = None,
) -> list[ImageAction]:
    """Build `ref` from `context` on the head, then stream it to the nodes whose image ID
    differs from the new build (or build it on every node). Docker's layer cache makes an
    unchanged context rebuild to the same ID, so unchanged nodes are skipped."""
    if is_pinned(ref):
        raise RecipeError(
            f"docker_image = {ref!r} is pinned to a registry digest: it can be pulled, not built"
        )
    say = progress or (lambda _n, _m: None)
    tar = context_tar(context)
    if on_each_node:
        for name in transports:
            say(name, f"building {ref} ({len(tar) / 1e6:.1f} MB context)")
        names = list(transports)

        def one(name: str) -> ImageAction:
            return _timed(
                name,
                lambda: (
                    "built",
                    build_on(transports[name], ref, tar, dockerfile, no_cache=no_cache),
                    "built here",
                ),
            )

        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            return list(pool.map(one, names))
    say(head, f"building {ref} ({len(tar) / 1e6:.1f} MB context)")
    built = _timed(
        head,
        lambda: ("built", build_on(transports[head], ref, tar, dockerfile, no_cache=no_cache), "built here"),
    )
    if not built.ok:
        return [built]
    rest = distribute(ref, head, transports, progress=progress)
    return [built] + [a for a in rest if a.node != head]


def ensure_same_image(
    plan: Plan, transports: Mapping[str, Transport], *, allow_mismatch: bool = False
) -> None:
    """For `up`: every docker rank's node must hold the same image ID (NodeError otherwise,
    unless allow_mismatch)."""
    for ref in sorted({r.image for r in plan.ranks if r.runtime == "docker" and r.image}):
        nodes = {r.node.name: transports[r.node.name] for r in plan.ranks if r.image == ref}
        if len(nodes) > 1:
            verify_same_id(nodes, ref, allow_mismatch=allow_mismatch)
