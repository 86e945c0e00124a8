"""What a stored run records about itself: configuration, deployment facts, sparkfleet revision."""

from __future__ import annotations

import platform
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import sparkfleet
from sparkfleet.bench.endpoint import Endpoint

# Deployment facts copied from the lifecycle record when present (names as the lead stores them).
DEPLOYMENT_KEYS = ("recipe", "recipe_path", "nodes", "parallelism", "tensor_parallel_size",
                   "pipeline_parallel_size", "flags", "args", "image", "cluster", "plan")  # fmt: skip


@lru_cache(maxsize=1)
def sparkfleet_revision() -> str:
    """``<version>+g<sha>[.dirty]`` from the source checkout, else the package version."""
    version = getattr(sparkfleet, "__version__", "0")
    root = Path(sparkfleet.__file__).resolve().parent.parent.parent
    if not (root / ".git").exists():
        return str(version)
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return str(version)
    return f"{version}+g{sha}" + (".dirty" if dirty else "")


def run_meta(endpoint: Endpoint, config: Any, **extra: Any) -> dict[str, Any]:
    """The metadata stored with a run."""
    cfg = asdict(config) if is_dataclass(config) and not isinstance(config, type) else dict(config)
    deployment: Mapping[str, Any] = endpoint.meta or {}
    return {
        "config": cfg,
        "model": endpoint.model,
        "engine": endpoint.engine,
        "engine_version": endpoint.engine_version,
        "max_model_len": endpoint.max_model_len,
        "deployment": endpoint.deployment,
        **{k: deployment[k] for k in DEPLOYMENT_KEYS if k in deployment},
        "sparkfleet": sparkfleet_revision(),
        "client_host": socket.gethostname(),
        "python": platform.python_version(),
        **extra,
    }
