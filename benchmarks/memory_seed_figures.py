"""The memory model beside the seeds' own figures (issue 7's bar: within 2 % where the figure
follows from a stated formula; measurements are shown beside the estimate, not matched).

    python benchmarks/memory_seed_figures.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkfleet.config.cluster import load_cluster  # noqa: E402
from sparkfleet.config.recipe import load_recipe  # noqa: E402
from sparkfleet.config.sizes import parse_size  # noqa: E402
from sparkfleet.plan.build import plan  # noqa: E402
from sparkfleet.plan.memory import GIB, MIB, memory_plan, nccl_pinned, prefill_transient  # noqa: E402

SEED = ROOT.parent / "shared" / "seeds" / "launcher" / "recipes" / "dsv41-flash-4x-mia"


def row(what: str, model: float, seed: float, unit: str, kind: str = "formula") -> None:
    err = (model - seed) / seed * 100
    ok = ("within 2 %" if abs(err) <= 2 else "OFF") if kind == "formula" else "shown beside, not matched"
    print(f"  {what:<48} model {model:>9.3f} {unit:<4} seed {seed:>8.3f} {unit:<4} {err:+6.1f} %  [{kind}] {ok}")


def main() -> None:
    recipe = load_recipe(SEED)
    recipe = recipe.model_copy(
        update={"memory": recipe.memory.model_copy(
            update={"kv_bytes_per_token": 1670.75, "device_memory": parse_size("121.7GiB")})}
    )  # fmt: skip
    p = plan(recipe, load_cluster(ROOT / "examples" / "clusters" / "spark4.toml"), "mia")
    mp = memory_plan(p.ranks[1], p.memory)
    env = {e.key: e.value for e in p.ranks[1].env}
    default, reduced = nccl_pinned({}), nccl_pinned(env)
    print("seed dsv41-flash-4x-mia (flags and env read from the planned rank-1 argv/env):")
    row("static pool 0.80 × 121.7 GiB", mp.static_pool / GIB, 0.80 * 121.7, "GiB")  # type: ignore[operator]
    row("KV 8,000,000 × 1,670.75 B", mp.item("kv_cache").bytes / 1e9, 13.4, "GB")  # type: ignore[operator]
    row("NCCL defaults 512 × 9.19 MiB (in MiB)", default.bytes / MIB, 512 * 9.19, "MiB")
    row("NCCL defaults, the seed's '4.7 GiB' label", default.bytes / GIB, 4.7, "GiB", "label: 4,705 MiB")
    row("NCCL defaults vs measured 5.0 GB", default.bytes / 1e9, 5.0, "GB", "measured")
    row("NCCL seed env (1 MiB/^LL128/8 ch) vs measured", reduced.bytes / 1e9, 0.14, "GB", "measured")
    row("indexer transient, chunk 1024, 1M prompt", prefill_transient(14, 1024, 1_048_576, {})[0] / 1e9, 15, "GB")
    row("indexer transient, chunk 4096, 1M prompt", prefill_transient(14, 4096, 1_048_576, {})[0] / 1e9, 60, "GB")


if __name__ == "__main__":
    main()
