"""sparkfleet: launch, stage, verify, benchmark and evaluate multi-node LLM serving deployments.

The library surface (``load_recipe``, ``load_cluster``, ``make_plan``, ``up``, ``down``, ``status``,
``bench_decode``) lives in ``sparkfleet.api`` and is loaded on first use: importing a stdlib-only
module such as ``sparkfleet.config.caches`` (engine venvs do) must not pull in pydantic or httpx.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
_API = ("Cluster", "Deployment", "Plan", "RankStatus", "Recipe", "UpResult", "bench_decode", "down",
        "load_cluster", "load_recipe", "make_plan", "status", "up")  # fmt: skip
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from sparkfleet import api

        return getattr(api, name)
    raise AttributeError(f"module 'sparkfleet' has no attribute {name!r}")
