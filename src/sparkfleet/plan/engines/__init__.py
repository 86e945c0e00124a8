"""Engine adapters: how each engine is started on each rank and how it says it is ready."""

from __future__ import annotations

from sparkfleet.plan.engines.base import (
    AbortRoute,
    EngineAdapter,
    LaunchSpec,
    MemoryRules,
    RankContext,
    Readiness,
)
from sparkfleet.plan.engines.llamacpp import LlamaCpp
from sparkfleet.plan.engines.sglang import SGLang
from sparkfleet.plan.engines.vllm import VLLM

ENGINES: dict[str, EngineAdapter] = {"sglang": SGLang(), "vllm": VLLM(), "llama-cpp": LlamaCpp()}


def engine_for(name: str) -> EngineAdapter:
    """The adapter for an engine name (the recipe model has already checked it)."""
    return ENGINES[name]


__all__ = [
    "ENGINES",
    "AbortRoute",
    "EngineAdapter",
    "LaunchSpec",
    "MemoryRules",
    "RankContext",
    "Readiness",
    "engine_for",
]
