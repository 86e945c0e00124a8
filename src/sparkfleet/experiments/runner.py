"""``sparkfleet ab``: rounds of two variants in alternating order (A B, then B A, …), each one
brought up (verify + smoke), measured with the bench's own decode/prefill runs and optionally
the quality tasks, and taken down; then one report.

Every finished variant-round is stored as it ends. Ctrl-C (or SIGTERM) takes the running variant
down, marks the experiment interrupted and reports the rounds that finished.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkfleet.apply.configurations import ConfigSpec
from sparkfleet.apply.down import down
from sparkfleet.apply.observe import logs
from sparkfleet.apply.switch import release
from sparkfleet.apply.up import shielded, sigterm_interrupts, up  # up's SIGTERM-as-Ctrl-C and shield
from sparkfleet.bench.decode import DecodeConfig, DecodeTierRun
from sparkfleet.bench.endpoint import Endpoint, resolve_endpoint
from sparkfleet.bench.prefill import PrefillConfig, PrefillRun
from sparkfleet.bench.runs import Measured, create_run, measure
from sparkfleet.bench.store import BenchStore
from sparkfleet.errors import SparkfleetError, UsageError
from sparkfleet.evals.results import QualityRun
from sparkfleet.experiments.report import build_report
from sparkfleet.experiments.store import Experiments, VariantRound
from sparkfleet.experiments.verdict import MIN_EFFECT
from sparkfleet.state.deployments import Deployments
from sparkfleet.state.store import Store

Say = Callable[[str], None]


@dataclass(frozen=True)
class ABConfig:
    """What ``ab`` runs."""

    recipe: Path
    variants: tuple[str, str]
    rounds: int = 3
    cluster: Path | None = None
    name: str | None = None
    sets: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    decode: DecodeConfig | None = field(default_factory=lambda: DecodeConfig(concurrency=(1,), repeats=3))
    prefill: PrefillConfig | None = None
    quality: bool = False
    quality_categories: tuple[str, ...] | None = None
    quality_ids: tuple[str, ...] | None = None
    min_effect: float = MIN_EFFECT
    timeout: float | None = None

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise UsageError("--rounds must be at least 1")
        if self.variants[0] == self.variants[1]:
            raise UsageError(f"--variants names {self.variants[0]!r} twice: an A/B needs two variants "
                                  "(define an identical one with extends to measure the noise)")  # fmt: skip
        if self.decode is None and self.prefill is None and not self.quality:
            raise UsageError("nothing to measure: give --bench decode and/or prefill, or --eval quality")

    def spec(self, variant: str) -> ConfigSpec:
        return ConfigSpec(self.recipe, variant, self.sets, self.env, self.cluster, self.name)


# What engines print about their KV pool and memory at boot; first match per figure wins.
FIGURES: tuple[tuple[str, re.Pattern[str], float], ...] = (
    ("kv cache MiB", re.compile(r"(?:KV self size|llama_kv_cache\w*:.*?size)\s*=\s*([\d.]+)\s*MiB"), 1.0),
    ("kv cache tokens", re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens"), 1.0),
    ("kv cache tokens", re.compile(r"KV Cache is allocated\.\s*#tokens:\s*(\d+)"), 1.0),
    ("kv cache tokens", re.compile(r"max_total_num_tokens=(\d+)"), 1.0),
    ("weights GiB", re.compile(r"Model loading took\s*([\d.]+)\s*GiB"), 1.0),
    ("model buffer MiB", re.compile(r"(?:CPU|CUDA\d*)_Mapped model buffer size\s*=\s*([\d.]+)\s*MiB"), 1.0),
)


def engine_figures(text: str) -> dict[str, float]:
    """The KV pool and memory figures an engine's boot log states (llama.cpp, vLLM, SGLang)."""
    out: dict[str, float] = {}
    for name, pattern, scale in FIGURES:
        found = pattern.search(text)
        if found and name not in out:
            out[name] = float(found.group(1).replace(",", "")) * scale
    return out


def _bench_metrics(part: VariantRound, runs: Measured) -> None:
    for run in runs:
        if isinstance(run, DecodeTierRun):
            figures: tuple[tuple[str, float | None, str, bool], ...] = (
                (f"decode {run.tier} tok/s", run.stats.steady_tps, "tok/s", True),
                (f"decode {run.tier} TTFT p50", run.stats.ttft.p50, "ms", False))  # fmt: skip
        elif isinstance(run, PrefillRun):
            figures = ((f"prefill {run.length} tok/s", run.sample.rate, "tok/s", True),)
        else:
            continue
        for metric, value, unit, higher in figures:
            if value is not None:
                part.metrics.setdefault(metric, []).append(value)
                part.units[metric], part.higher_is_better[metric] = unit, higher


def _measure(cfg: ABConfig, part: VariantRound, name: str, store: Store, label: str) -> None:
    endpoint = resolve_endpoint(name, store=store)
    bench = BenchStore(store)
    for kind, config in (("decode", cfg.decode), ("prefill", cfg.prefill)):
        if config is not None:
            run_id = create_run(bench, kind, endpoint, config, label)
            part.bench_runs.append(run_id)
            _bench_metrics(part, measure(bench, run_id, endpoint, config))
    if cfg.quality:
        run = _quality(cfg, endpoint, label, store)
        part.quality, part.quality_run = {r.id: r.passed for r in run.results}, run.id
        # Completion speed from each answer's usage (not streamed): the speed figure of engines
        # whose streams carry no usage, which the decode bench rightly refuses to guess at.
        speed = run.median_tok_s()
        if speed is not None:
            part.metrics["quality median tok/s"] = [speed]
            part.units["quality median tok/s"], part.higher_is_better["quality median tok/s"] = "tok/s", True


def _quality(cfg: ABConfig, endpoint: Endpoint, label: str, store: Store) -> QualityRun:
    from sparkfleet.evals.runner import run_stored
    from sparkfleet.evals.sandbox import SandboxLimits
    from sparkfleet.evals.tasks import load_tasks

    tasks = load_tasks(None, categories=cfg.quality_categories, ids=cfg.quality_ids)
    return run_stored(endpoint, tasks, label=label, store=store, limits=SandboxLimits())


def _variant_round(cfg: ABConfig, experiment: int, variant: str, rnd: int, position: int, store: Store,
                   say: Say) -> VariantRound:  # fmt: skip
    spec = cfg.spec(variant)
    planned = spec.plan()
    say(f"round {rnd + 1}/{cfg.rounds}: {variant} up")
    try:
        result = up(planned, config=spec, deployments=Deployments(store), timeout=cfg.timeout)
        release(planned.name, Deployments(store))  # behind a gateway: what the change held goes on
        part = VariantRound(rnd, position, variant, result.seconds, configuration=result.configuration)
        record = Deployments(store).get(planned.name)
        if record is not None:
            part.figures = engine_figures("\n".join(logs(record, tail=2000).values()))
        say(f"round {rnd + 1}/{cfg.rounds}: {variant} ready in {result.seconds:.1f}s; measuring")
        _measure(cfg, part, planned.name, store, f"ab {experiment} r{rnd + 1} {variant}")
    finally:
        # Also after an interrupt that lands between up's success and here: up rolled back only
        # what it had not finished ("failed"), a ready deployment is this runner's to stop.
        record = Deployments(store).get(planned.name)
        if record is not None and record.status not in ("stopped", "failed"):
            with shielded():
                # hold: behind a gateway, requests wait for the next variant (apply/switch.py).
                down(record, deployments=Deployments(store), hold=True)
            say(f"round {rnd + 1}/{cfg.rounds}: {variant} down")
    return part


def run_ab(cfg: ABConfig, store: Store | None = None, say: Say = lambda _m: None) -> dict[str, Any]:
    """Run the experiment and return its report (also stored, whatever the outcome)."""
    store = store or Store()
    for variant in cfg.variants:
        cfg.spec(variant).plan()  # a variant that cannot plan is refused before anything starts
    name = cfg.spec(cfg.variants[0]).deployment
    experiments = Experiments(store)
    config = {"rounds": cfg.rounds, "sets": list(cfg.sets), "env": [k for k, _ in cfg.env],
              "decode": asdict(cfg.decode) if cfg.decode else None,
              "prefill": asdict(cfg.prefill) if cfg.prefill else None, "quality": cfg.quality,
              "min_effect": cfg.min_effect}  # fmt: skip
    experiment = experiments.create(str(cfg.recipe), name, cfg.variants, cfg.rounds, config)
    say(f"experiment {experiment}: {cfg.variants[0]} vs {cfg.variants[1]}, {cfg.rounds} round(s) as {name!r}")
    status, note = "complete", None
    try:
        with sigterm_interrupts():
            for rnd in range(cfg.rounds):
                order = cfg.variants if rnd % 2 == 0 else cfg.variants[::-1]
                for position, variant in enumerate(order):
                    experiments.add_round(experiment, _variant_round(cfg, experiment, variant, rnd, position, store,
                                                                     say))  # fmt: skip
    except KeyboardInterrupt:
        status, note = "interrupted", "interrupted by the user; the running variant was taken down"
    except SparkfleetError as exc:
        status, note = "failed", exc.message
    release(name, Deployments(store))  # the last variant is down for good: nothing waits for it
    experiments.finish(experiment, status, None, note)
    report = build_report(experiments.get(experiment), experiments.rounds(experiment), cfg.min_effect)
    report["note"] = note
    experiments.finish(experiment, status, report, note)
    return report
