"""The head's checkpoint, for the memory check: config.json and every safetensors header of the
newest snapshot revision in the Hugging Face cache."""

from __future__ import annotations

import json
import re
from typing import Any

from sparkfleet.doctor.probes import snapshot
from sparkfleet.doctor.probes.fact import Fact, section
from sparkfleet.nodes.shipped.safetensors_index import header_tensors, tensor_nbytes

# (model config, tensor name → bytes); either is None when the snapshot has none.
Checkpoint = tuple[dict[str, Any] | None, dict[str, int] | None]


def command(hf_cache: str, repo: str) -> list[str]:
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


def parse(stdout: str) -> Checkpoint:
    """(model config, tensor name → bytes) from `command`'s output."""
    config: dict[str, Any] | None = None
    tensors: dict[str, int] = {}
    for part in re.split(r"(?m)^## ", stdout)[1:]:
        head, _, body = part.partition("\n")
        if head == "config" and body.strip():
            config = json.loads(body)
        elif head.startswith("header "):
            tensors.update(tensor_nbytes(header_tensors(body)))
    return config, (tensors or None)


FACT = Fact(
    "checkpoint",
    lambda req: (
        {"checkpoint": command(req.hf_cache, req.model_repo)}
        if req.hf_cache and req.model_repo and req.checkpoint_headers
        else {}
    ),
    lambda outs, _asked: parse(section(outs, "checkpoint").stdout),
)
