"""Container images on every node: build from the recipe's `docker_image_dir`, distribute with
`docker save | docker load`, and make sure every node runs the same image ID.

build tars the context here and pipes it to `docker build -` on the head (no copy of the folder
on any node), then streams the image to every node whose ID differs; `on_each_node` builds on
every node instead (like the seeds' launchers), which may give different IDs. push streams the
head's (or `source`'s) image. A pinned reference (`repo@sha256:…`) names a registry manifest that
neither a build nor a `docker load` can reproduce: nodes that lack it pull it. Bytes flow source
→ this machine → targets through pipes, so an image of tens of GB never sits in memory.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkfleet.errors import ClusterError, NodeError, RecipeError
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.runtime.docker import build_image, image_id, pull, stream_image
from sparkfleet.nodes.transport.base import Transport

if TYPE_CHECKING:
    from sparkfleet.plan.build import Plan
    from sparkfleet.plan.model import ImageSpec

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


def image_ids(transports: Mapping[str, Transport], ref: str) -> dict[str, str | None]:
    """image_id on every node, in parallel (the first node's error when one cannot tell)."""
    return fan_out(transports, lambda n: image_id(transports[n], ref)).raise_first()


def verify_same_id(transports: Mapping[str, Transport], ref: str, *, allow_mismatch: bool = False) -> dict[str, str]:
    """The image ID of every node; NodeError naming the nodes that lack the image or differ
    from the first node (unless allow_mismatch, for a deliberate mixed fleet)."""
    ids = image_ids(transports, ref)
    missing = [n for n, i in ids.items() if i is None]
    if missing:
        raise NodeError(missing[0], f"image {ref} is not on {', '.join(missing)} (sparkfleet image build|push)")
    head = next(iter(ids))
    differ = [f"{n} {i[7:19]}" for n, i in ids.items() if i != ids[head]]  # type: ignore[index]
    if differ and not allow_mismatch:
        raise NodeError(head, f"image {ref} differs across nodes ({head} {ids[head][7:19]}; {', '.join(differ)}): "  # type: ignore[index]
                              "run `sparkfleet image push` to give every node the head's image")  # fmt: skip
    return {n: i for n, i in ids.items() if i is not None}


def context_tar(context: Path) -> bytes:
    """The build context as an uncompressed tar, the way `docker build -` reads it from stdin.
    Paths listed in .dockerignore (simple patterns) are left out."""
    listed = (context / ".dockerignore").read_text().splitlines() if (context / ".dockerignore").is_file() else []
    ignore = [line.strip().rstrip("/") for line in listed if line.strip() and not line.startswith("#")]
    buf = io.BytesIO()
    # GNU format: docker sniffs stdin for a plain tar header and takes a PAX one for a Dockerfile.
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(context.rglob("*")):
            rel = path.relative_to(context).as_posix()
            if any(Path(rel).match(p) or rel == p or rel.startswith(p + "/") for p in ignore):
                continue
            tar.add(path, arcname=rel, recursive=False)
    return buf.getvalue()


def distribute(ref: str, source: str, transports: Mapping[str, Transport], *,
               progress: Progress | None = None) -> list[ImageAction]:  # fmt: skip
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
    actions += [ImageAction(n, "skipped", i, "same image ID already", 0.0) for n, i in have.items() if i == want]
    if not todo:
        return actions
    if is_pinned(ref):
        for name in todo:
            say(name, f"pulling pinned {ref}")

        def pull_one(name: str) -> ImageAction:
            res = pull(todo[name], ref)
            if not res.ok:
                return ImageAction(name, "failed", None, f"docker pull {ref}: {res.tail(2)}", 0.0)
            got = image_id(todo[name], ref)
            ok = got == want
            detail = "pulled" if ok else f"pulled {got}, but {source} has {want}"
            return ImageAction(name, "pulled" if ok else "failed", got, detail, 0.0)

        return actions + list(fan_out(todo, pull_one, workers=len(todo)).raise_first().values())
    say(",".join(todo), f"streaming {ref} from {source}")
    errors = stream_image(transports[source], ref, todo)
    elapsed = time.monotonic() - start
    for name, t in todo.items():
        if name in errors:
            actions.append(ImageAction(name, "failed", None, errors[name], elapsed))
        elif (got := image_id(t, ref)) == want:
            actions.append(ImageAction(name, "loaded", got, f"streamed from {source}", elapsed))
        else:
            actions.append(ImageAction(name, "failed", got, f"loaded {got}, expected {want}", elapsed))
    return actions


def build(ref: str, context: Path, transports: Mapping[str, Transport], head: str, *, dockerfile: str = "Dockerfile",
          on_each_node: bool = False, no_cache: bool = False,
          progress: Progress | None = None) -> list[ImageAction]:  # fmt: skip
    """Build `ref` from `context` on the head, then stream it to the nodes whose image ID
    differs from the new build (or build it on every node). Docker's layer cache makes an
    unchanged context rebuild to the same ID, so unchanged nodes are skipped."""
    if is_pinned(ref):
        raise RecipeError(f"docker_image = {ref!r} is pinned to a registry digest: it can be pulled, not built")
    say = progress or (lambda _n, _m: None)
    tar = context_tar(context)

    def build_on(name: str) -> ImageAction:
        start = time.monotonic()
        try:
            iid = build_image(transports[name], ref, tar, dockerfile, no_cache=no_cache)
        except NodeError as exc:
            return ImageAction(name, "failed", None, exc.detail, time.monotonic() - start)
        return ImageAction(name, "built", iid, "built here", time.monotonic() - start)

    for name in transports if on_each_node else [head]:
        say(name, f"building {ref} ({len(tar) / 1e6:.1f} MB context)")
    if on_each_node:
        return list(fan_out(transports, build_on, workers=max(1, len(transports))).raise_first().values())
    built = build_on(head)
    if not built.ok:
        return [built]
    rest = distribute(ref, head, transports, progress=progress)
    return [built] + [a for a in rest if a.node != head]


def plan_image(plan: Plan) -> ImageSpec:
    """The plan's image; RecipeError for a recipe of host processes, which has none."""
    if plan.image is None:
        raise RecipeError(f"{plan.recipe_source}: no docker_image: this recipe runs host processes")
    return plan.image


def build_recipe_image(plan: Plan, transports: Mapping[str, Transport], *, dockerfile: str = "Dockerfile",
                       on_each_node: bool = False, no_cache: bool = False,
                       progress: Progress | None = None) -> list[ImageAction]:  # fmt: skip
    """`image build`: ``build`` the plan's image from its docker_image_dir, rank 0's node being
    the head; RecipeError when the recipe names no such folder or it holds no dockerfile."""
    image, source = plan_image(plan), plan.recipe_source
    if not image.build_dir:
        raise RecipeError(f"{source}: no docker_image_dir to build {image.ref} from (use `image push`)")
    if image.context is None:
        why = f"docker_image_dir = {image.build_dir!r}: no such folder (looked in {image.looked_in[0]})"
        raise RecipeError(f"{source}: {why}")
    context = Path(image.context)
    if not (context / dockerfile).is_file():
        raise RecipeError(f"{source}: docker_image_dir {context} has no {dockerfile}")
    return build(image.ref, context, transports, plan.ranks[0].node.name, dockerfile=dockerfile,
                 on_each_node=on_each_node, no_cache=no_cache, progress=progress)  # fmt: skip


def push_recipe_image(plan: Plan, transports: Mapping[str, Transport], source: str | None = None, *,
                      progress: Progress | None = None) -> list[ImageAction]:  # fmt: skip
    """`image push`: ``distribute`` the plan's image from source (default: rank 0's node)."""
    src = source or plan.ranks[0].node.name
    if src not in transports:
        raise ClusterError(f"--from {src}: not a node of this deployment ({', '.join(transports)})")
    return distribute(plan_image(plan).ref, src, transports, progress=progress)


def ensure_same_image(plan: Plan, transports: Mapping[str, Transport], *, allow_mismatch: bool = False) -> None:
    """For `up`: every docker rank's node holds the same image ID (else NodeError, unless allow_mismatch)."""
    for ref in sorted({r.image for r in plan.ranks if r.runtime == "docker" and r.image}):
        nodes = {r.node.name: transports[r.node.name] for r in plan.ranks if r.image == ref}
        if len(nodes) > 1:
            verify_same_id(nodes, ref, allow_mismatch=allow_mismatch)
