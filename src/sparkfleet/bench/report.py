"""Stored runs → tier summaries, comparisons and exports (JSON, CSV, Markdown).

A tier summary gives the median and min–max of a figure over the tier's measured repeats; a tier
whose headline figure spreads more than 10 % is flagged. ``compare`` calls a difference real when
it exceeds the runs' spread: the two medians differ by more than the wider of the two min–max
ranges. (A run that spreads widely is flagged, and cannot tell small differences apart.)
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkfleet.bench.arrivals import rate_of_label
from sparkfleet.bench.stats import Spread
from sparkfleet.bench.store import BenchStore, StoredRun, StoredSample

EXPORT_SCHEMA = "sparkfleet.bench/1"


@dataclass(frozen=True)
class TierSummary:
    """One tier over its repeats. Decode: ``headline`` is the steady aggregate tok/s; prefill:
    the prefill tok/s."""

    tier: str
    kind: str
    prompt_type: str | None
    concurrency: int | None
    length: int | None
    runs: int
    headline: Spread
    per_stream: Spread
    output_throughput: Spread
    ttft_p50: Spread
    tpot_p50: Spread
    itl_p50: Spread
    itl_p99: Spread
    prompt_tokens: Spread
    failed: int
    length_mismatch: int
    cached_tokens: int
    values: tuple[float, ...] = ()  # the headline figure of each repeat, in order
    # Open-loop (serve) tiers: the asked rate, every figure of SERVE_FIGURES over the repeats,
    # and the most foreign requests any repeat saw (None: the engine did not tell).
    rate: float | None = None
    figures: Mapping[str, Spread] = field(default_factory=dict)
    foreign_requests: int | None = None

    @property
    def flagged(self) -> bool:
        return self.headline.flagged

    def flags(self) -> list[str]:
        """What a reader must know before trusting this tier's figures, most serious first."""
        out = []
        if self.kind == "serve":
            if self.foreign_requests:
                out.append(f"FOREIGN {self.foreign_requests}")
            elif self.foreign_requests is None:
                out.append("running count unknown")
        elif self.flagged:
            out.append(f"spread {100 * (self.headline.rel_spread or 0):.0f}%")
        if self.cached_tokens:
            out.append(f"CACHED {self.cached_tokens} tokens")
        if self.length_mismatch:
            out.append(f"{self.length_mismatch} length mismatch")
        if self.failed:
            out.append(f"{self.failed} failed")
        return out


# Serve sample metric → where it is in the stored sample (a key, or a key and a Dist field).
SERVE_FIGURES: dict[str, tuple[str, ...]] = {
    "achieved_rate": ("achieved_rate",),
    "request_throughput": ("request_throughput",),
    "goodput": ("goodput",),
    "good_share": ("good_share",),
    "output_throughput": ("output_throughput",),
    **{f"{d}_{p}": (d, p) for d in ("ttft", "tpot", "itl", "e2el") for p in ("p50", "p90", "p99")},
    "server_tpot_ms": ("server", "server_tpot_ms"),
    "kv_usage_max": ("server", "kv_usage_max"),
    "spec_accept_length": ("server", "spec_accept_length"),
    "prefix_cache_hit_rate": ("server", "prefix_cache_hit_rate"),
}


def _dig(metrics: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = metrics
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _serve_summary(tier: str, ms: Sequence[Mapping[str, Any]]) -> TierSummary:
    figures = {name: Spread.of(_dig(m, path) for m in ms) for name, path in SERVE_FIGURES.items()}
    foreign = [
        m["server"]["foreign_requests"] for m in ms if (m.get("server") or {}).get("foreign_requests") is not None
    ]
    return TierSummary(
        tier=tier,
        kind="serve",
        prompt_type=None,
        concurrency=ms[0].get("max_concurrency"),
        length=None,
        runs=len(ms),
        headline=figures["output_throughput"],
        per_stream=Spread.of(()),
        output_throughput=figures["output_throughput"],
        ttft_p50=figures["ttft_p50"],
        tpot_p50=figures["tpot_p50"],
        itl_p50=figures["itl_p50"],
        itl_p99=figures["itl_p99"],
        prompt_tokens=Spread.of(m.get("total_input_tokens") for m in ms),
        failed=sum(m.get("failed", 0) for m in ms),
        length_mismatch=sum(m.get("length_mismatch", 0) for m in ms),
        cached_tokens=sum(m.get("cached_tokens", 0) for m in ms),
        values=tuple(m["output_throughput"] for m in ms if m.get("output_throughput") is not None),
        rate=rate_of_label(tier),
        figures=figures,
        foreign_requests=max(foreign) if foreign else None,
    )


def _tier_order(kind: str, tier: str) -> tuple[Any, ...]:
    if kind == "prefill":
        return (int(tier),)
    if kind == "serve":
        return (rate_of_label(tier),)
    ptype, _, conc = tier.partition("/c")
    order = ("prose", "code", "structured", "json")
    return (order.index(ptype) if ptype in order else len(order), ptype, int(conc or 0))


def summarize(run: StoredRun, samples: Sequence[StoredSample]) -> list[TierSummary]:
    """Per-tier summaries of a run, in table order."""
    by_tier: dict[str, list[Mapping[str, Any]]] = {}
    for s in samples:
        by_tier.setdefault(s.tier, []).append(s.metrics)
    out = []
    for tier in sorted(by_tier, key=lambda t: _tier_order(run.kind, t)):
        ms = by_tier[tier]
        if run.kind == "serve":
            out.append(_serve_summary(tier, ms))
            continue
        if run.kind == "prefill":
            out.append(
                TierSummary(
                    tier=tier,
                    kind="prefill",
                    prompt_type=None,
                    concurrency=1,
                    length=int(tier),
                    runs=len(ms),
                    headline=Spread.of(m.get("rate") for m in ms),
                    per_stream=Spread.of(()),
                    output_throughput=Spread.of(()),
                    ttft_p50=Spread.of((m["ttft"] * 1000 if m.get("ttft") else None) for m in ms),
                    tpot_p50=Spread.of(()),
                    itl_p50=Spread.of(()),
                    itl_p99=Spread.of(()),
                    prompt_tokens=Spread.of(m.get("prompt_tokens") for m in ms),
                    failed=sum(1 for m in ms if m.get("error")),
                    length_mismatch=0,
                    cached_tokens=sum(m.get("cached_tokens") or 0 for m in ms),
                    values=tuple(m["rate"] for m in ms if m.get("rate") is not None),
                )
            )
            continue
        ptype, _, conc = tier.partition("/c")
        out.append(
            TierSummary(
                tier=tier,
                kind="decode",
                prompt_type=ptype,
                concurrency=int(conc),
                length=None,
                runs=len(ms),
                headline=Spread.of(m.get("steady_tps") for m in ms),
                per_stream=Spread.of(m.get("per_stream_tps") for m in ms),
                output_throughput=Spread.of(m.get("output_throughput") for m in ms),
                ttft_p50=Spread.of(m["ttft"]["p50"] for m in ms),
                tpot_p50=Spread.of(m["tpot"]["p50"] for m in ms),
                itl_p50=Spread.of(m["itl"]["p50"] for m in ms),
                itl_p99=Spread.of(m["itl"]["p99"] for m in ms),
                prompt_tokens=Spread.of(m.get("total_input_tokens") for m in ms),
                failed=sum(m.get("failed", 0) for m in ms),
                length_mismatch=sum(m.get("length_mismatch", 0) for m in ms),
                cached_tokens=sum(m.get("cached_tokens", 0) for m in ms),
                values=tuple(m["steady_tps"] for m in ms if m.get("steady_tps") is not None),
            )
        )
    return out


def stored_tiers(bench: BenchStore, run_id: int) -> tuple[StoredRun, list[TierSummary]]:
    """A stored run and its tier summaries (read without the per-request detail)."""
    run = bench.get_run(run_id)
    return run, summarize(run, bench.samples(run_id, with_requests=False))


# ---------------------------------------------------------------- comparison


@dataclass(frozen=True)
class TierComparison:
    """One tier present in both runs."""

    tier: str
    a: Spread
    b: Spread
    ratio: float | None  # b / a of the medians
    exceeds_spread: bool  # |median B − median A| > the wider min–max range of the two


def compare(a: Sequence[TierSummary], b: Sequence[TierSummary], figure: str | None = None) -> list[TierComparison]:
    """Tier by tier, B against A, on the headline figure (or each tier's ``figures[figure]``)."""

    def pick(t: TierSummary) -> Spread:
        return t.figures[figure] if figure else t.headline

    b_by = {t.tier: t for t in b}
    out = []
    for ta in a:
        tb = b_by.get(ta.tier)
        if tb is None:
            continue
        x, y = pick(ta), pick(tb)
        ratio = y.median / x.median if x.median and y.median is not None else None
        apart = False
        if None not in (x.median, y.median, x.low, x.high, y.low, y.high):
            spread = max(x.high - x.low, y.high - y.low)  # type: ignore[operator]
            apart = abs(y.median - x.median) > spread  # type: ignore[operator]
        out.append(TierComparison(ta.tier, x, y, ratio, bool(apart)))
    return out


# ---------------------------------------------------------------- formatting


def fmt(value: float | None, digits: int = 1) -> str:
    """A figure, or an en dash when missing."""
    return "–" if value is None else f"{value:.{digits}f}"


def fmt_spread(s: Spread, digits: int = 1) -> str:
    """``median (min–max)``, or the bare value for one run."""
    if s.median is None:
        return "–"
    if s.n == 1:
        return fmt(s.median, digits)
    return f"{fmt(s.median, digits)} ({fmt(s.low, digits)}–{fmt(s.high, digits)})"


def run_title(run: StoredRun) -> str:
    """One line naming a run."""
    where = run.deployment or run.endpoint
    engine = f"{run.engine} {run.engine_version}" if run.engine_version else (run.engine or "?")
    label = f" [{run.label}]" if run.label else ""
    return f"run {run.id}{label}: {run.kind} {run.model} on {where} ({engine}), {run.created_at}, {run.status}"


def markdown(run: StoredRun, tiers: Sequence[TierSummary]) -> str:
    """Markdown tables in the layout of docs/tp4.md."""
    lines = [f"**{run_title(run)}**", ""]
    meta = run.meta
    cfg = meta.get("config", {}) if isinstance(meta, Mapping) else {}
    if run.kind == "decode":
        concs = sorted({t.concurrency or 0 for t in tiers})
        types = list(dict.fromkeys(t.prompt_type or "" for t in tiers))
        by = {(t.prompt_type, t.concurrency): t for t in tiers}
        tokens = cfg.get("new_tokens", "?")
        lines += [
            f"**Decode, aggregate tok/s (per stream in brackets)** — {tokens} new tokens, "
            f"median of {cfg.get('repeats', '?')} runs; † = runs spread > 10 %",
            "",
            "| prompt type | " + " | ".join(f"c{c}" for c in concs) + " |",
            "|---|" + "---:|" * len(concs),
        ]
        for ptype in types:
            cells = []
            for c in concs:
                t = by.get((ptype, c))
                if t is None or t.headline.median is None:
                    cells.append("–")
                    continue
                cell = fmt(t.headline.median)
                if c > 1 and t.per_stream.median is not None:
                    cell += f" ({fmt(t.per_stream.median)})"
                cells.append(cell + (" †" if t.flagged else ""))
            lines.append(f"| {ptype} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "**TTFT p50 / TPOT p50, ms**",
            "",
            "| prompt type | " + " | ".join(f"c{c}" for c in concs) + " |",
        ]
        lines.append("|---|" + "---:|" * len(concs))
        for ptype in types:
            cells = []
            for c in concs:
                t = by.get((ptype, c))
                cells.append("–" if t is None else f"{fmt(t.ttft_p50.median, 0)} / {fmt(t.tpot_p50.median)}")
            lines.append(f"| {ptype} | " + " | ".join(cells) + " |")
    elif run.kind == "serve":
        lines += serve_markdown(tiers)
    else:
        lines += [
            "**Prefill, cold, tok/s by prompt length** (one value per pass; † = spread > 10 %)",
            "",
            "| " + " | ".join(_klabel(t.length or 0) for t in tiers) + " |",
            "|" + "---:|" * len(tiers),
            "| " + " | ".join(_passes(t) for t in tiers) + " |",
        ]
        if meta.get("overhead_ms") is not None:
            lines += ["", f"Fixed overhead subtracted: {fmt(meta.get('overhead_ms'))} ms."]
        cached = sum(t.cached_tokens for t in tiers)
        if cached:
            lines += [
                "",
                f"**Warning:** {cached} prompt tokens were served from a cache; those rates are not cold.",
            ]
    notes = _notes(run, tiers)
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def serve_markdown(tiers: Sequence[TierSummary]) -> list[str]:
    """The rate tiers as one table: asked and achieved rate, goodput, tok/s beside TPOT."""
    lines = [
        "**Open loop, by asked request rate** (medians over repeats; ⚠ = foreign requests ran)",
        "",
        "| rate | achieved /s | req/s | goodput /s (share) | output tok/s | TPOT p50 ms (server) "
        "| TTFT p50 / p90 / p99 ms | ITL p99 ms | E2E p50 / p99 ms | KV max |",
        "|---|" + "---:|" * 9,
    ]
    for t in tiers:
        f = t.figures
        share = f["good_share"].median
        good = "–" if f["goodput"].median is None else f"{fmt(f['goodput'].median, 2)} ({fmt(100 * (share or 0), 0)} %)"
        kv = f["kv_usage_max"].median
        lines.append(
            f"| {t.tier}{' ⚠' if t.foreign_requests else ''} | {fmt(f['achieved_rate'].median, 2)} "
            f"| {fmt(f['request_throughput'].median, 2)} | {good} | {fmt(f['output_throughput'].median)} "
            f"| {fmt(f['tpot_p50'].median)} ({fmt(f['server_tpot_ms'].median)}) "
            f"| {fmt(f['ttft_p50'].median, 0)} / {fmt(f['ttft_p90'].median, 0)} / {fmt(f['ttft_p99'].median, 0)} "
            f"| {fmt(f['itl_p99'].median)} | {fmt(f['e2el_p50'].median, 0)} / {fmt(f['e2el_p99'].median, 0)} "
            f"| {'–' if kv is None else f'{100 * kv:.0f} %'} |"
        )
    return lines


def _klabel(length: int) -> str:
    return f"{length // 1024}k" if length % 1024 == 0 else str(length)


def _passes(t: TierSummary) -> str:
    if not t.values:
        return "–"
    text = " / ".join(fmt(v, 0) for v in t.values) if len(t.values) <= 3 else fmt_spread(t.headline, 0)
    return text + (" †" if t.flagged else "")


def _notes(run: StoredRun, tiers: Sequence[TierSummary]) -> list[str]:
    notes = []
    if run.status != "complete":
        notes.append(f"run is {run.status.upper()}: {run.note or 'interrupted'}")
    exact = run.meta.get("exact_length") if isinstance(run.meta, Mapping) else None
    if isinstance(exact, Mapping) and not exact.get("enforced", True):
        notes.append(f"exact length not enforced: {exact.get('note')}")
    mism = sum(t.length_mismatch for t in tiers)
    if mism:
        notes.append(f"{mism} requests generated a different number of tokens than asked (usage)")
    failed = sum(t.failed for t in tiers)
    if failed:
        notes.append(f"{failed} requests failed")
    foreign = [t.tier for t in tiers if t.foreign_requests]
    if foreign:
        notes.append(f"foreign requests ran on the server during {', '.join(foreign)}: those tiers are not clean")
    return notes


# ---------------------------------------------------------------- exports

_VLLM_DIST = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2el"}


def vllm_keys(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A decode sample's figures under ``vllm bench serve`` result key names."""
    out: dict[str, Any] = {
        "max_concurrency": metrics.get("concurrency"),
        "num_prompts": metrics.get("requests"),
        "completed": metrics.get("completed"),
        "failed": metrics.get("failed"),
        "duration": metrics.get("duration"),
        "total_input_tokens": metrics.get("total_input_tokens"),
        "total_output_tokens": metrics.get("total_output_tokens"),
        "output_throughput": metrics.get("output_throughput"),
        "request_throughput": (metrics["completed"] / metrics["duration"] if metrics.get("duration") else None),
        "total_token_throughput": (
            (metrics["total_input_tokens"] + metrics["total_output_tokens"]) / metrics["duration"]
            if metrics.get("duration")
            else None
        ),
    }
    for ours, theirs in _VLLM_DIST.items():
        d = metrics.get(ours) or {}
        out[f"mean_{theirs}_ms"] = d.get("mean")
        out[f"median_{theirs}_ms"] = d.get("p50")
        out[f"p90_{theirs}_ms"] = d.get("p90")
        out[f"p99_{theirs}_ms"] = d.get("p99")
    # Ours, with no vLLM counterpart.
    out["steady_output_throughput"] = metrics.get("steady_tps")
    out["steady_window_s"] = metrics.get("steady_window")
    out["per_stream_output_throughput"] = metrics.get("per_stream_tps")
    out["length_mismatch"] = metrics.get("length_mismatch")
    out["cached_tokens"] = metrics.get("cached_tokens")
    return out


def to_json(run: StoredRun, samples: Sequence[StoredSample], tiers: Sequence[TierSummary]) -> str:
    """The authoritative record: run metadata, tier summaries and every sample's figures."""
    doc = {
        "schema": EXPORT_SCHEMA,
        "run": asdict(run),
        "tiers": [serve_tier_json(t) if t.kind == "serve" else _tier_json(t) for t in tiers],
        "samples": [
            {
                "tier": s.tier,
                "repeat": s.repeat,
                **(vllm_keys(s.metrics) if run.kind == "decode" else dict(s.metrics)),
                "requests": [r.to_json() for r in s.requests],
            }
            for s in samples
        ],
    }
    return json.dumps(_finite(doc), indent=1, default=str) + "\n"


def _finite(obj: Any) -> Any:
    """``inf`` as the string ``"inf"`` everywhere (a rate tier, a config's sweep): JSON has no
    infinity, and ``Infinity`` breaks strict readers."""
    if isinstance(obj, float) and math.isinf(obj):
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, Mapping):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _tier_json(t: TierSummary) -> dict[str, Any]:
    def sp(s: Spread) -> dict[str, Any] | None:
        return None if s.median is None else {"median": s.median, "min": s.low, "max": s.high, "n": s.n}

    return {
        "tier": t.tier,
        "kind": t.kind,
        "prompt_type": t.prompt_type,
        "max_concurrency": t.concurrency,
        "prompt_length": t.length,
        "runs": t.runs,
        ("steady_output_throughput" if t.kind == "decode" else "prefill_throughput"): sp(t.headline),
        "spread": t.headline.rel_spread,
        "flagged": t.flagged,
        "per_stream_output_throughput": sp(t.per_stream),
        "output_throughput": sp(t.output_throughput),
        "median_ttft_ms": sp(t.ttft_p50),
        "median_tpot_ms": sp(t.tpot_p50),
        "median_itl_ms": sp(t.itl_p50),
        "p99_itl_ms": sp(t.itl_p99),
        "failed": t.failed,
        "length_mismatch": t.length_mismatch,
        "cached_tokens": t.cached_tokens,
    }


def serve_tier_json(t: TierSummary) -> dict[str, Any]:
    """One rate tier: medians over its repeats (and min–max), under the keys ``--json`` promises."""

    def med(name: str) -> float | None:
        return t.figures[name].median if name in t.figures else None

    return {
        "tier": t.tier,
        "kind": "serve",
        "request_rate": t.rate,  # inf is written "inf", as vllm bench serve writes it
        "achieved_rate": med("achieved_rate"),
        "request_throughput": med("request_throughput"),
        "goodput": med("goodput"),
        "good_share": med("good_share"),
        "foreign_requests": t.foreign_requests,
        "max_concurrency": t.concurrency,
        "runs": t.runs,
        "output_throughput": med("output_throughput"),
        **{f"{p}_{d}_ms": med(f"{d}_{p}") for d in ("ttft", "tpot", "itl", "e2el") for p in ("p50", "p90", "p99")},
        "server_tpot_ms": med("server_tpot_ms"),
        "kv_cache_usage_max": med("kv_usage_max"),
        "spec_accept_length": med("spec_accept_length"),
        "prefix_cache_hit_rate": med("prefix_cache_hit_rate"),
        "cached_tokens": t.cached_tokens,
        "failed": t.failed,
        "length_mismatch": t.length_mismatch,
        "spread": {k: {"median": v.median, "min": v.low, "max": v.high} for k, v in t.figures.items() if v.n > 1},
    }


CSV_COLUMNS = (
    "run_id", "kind", "tier", "prompt_type", "concurrency", "prompt_length", "runs",
    "median", "min", "max", "spread", "flagged", "per_stream_median", "output_throughput_median",
    "ttft_p50_ms", "tpot_p50_ms", "itl_p50_ms", "itl_p99_ms", "failed", "length_mismatch", "cached_tokens",
)  # fmt: skip


def to_csv(run: StoredRun, tiers: Sequence[TierSummary]) -> str:
    """One row per tier; ``median``/``min``/``max`` are the headline figure."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for t in tiers:
        writer.writerow(
            [
                run.id, t.kind, t.tier, t.prompt_type or "", t.concurrency or "", t.length or "", t.runs,
                _c(t.headline.median), _c(t.headline.low), _c(t.headline.high), _c(t.headline.rel_spread),
                int(t.flagged), _c(t.per_stream.median), _c(t.output_throughput.median),
                _c(t.ttft_p50.median), _c(t.tpot_p50.median), _c(t.itl_p50.median), _c(t.itl_p99.median),
                t.failed, t.length_mismatch, t.cached_tokens,
            ]
        )  # fmt: skip
    return buf.getvalue()


def _c(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}" if abs(value) < 1 else f"{value:.2f}"


def render_run(bench: BenchStore, run_id: int, form: str) -> str:
    """A stored run as JSON (vLLM key names where they exist, every request), CSV or Markdown
    (form ``md`` or ``markdown``)."""
    if form == "json":
        stored, samples = bench.get_run(run_id), bench.samples(run_id)
        return to_json(stored, samples, summarize(stored, samples))
    run, tiers = stored_tiers(bench, run_id)
    return to_csv(run, tiers) if form == "csv" else markdown(run, tiers)  # the callers checked form: csv or md


def write_run(bench: BenchStore, run_id: int, form: str, path: Path) -> None:
    """``render_run`` into path, or for form ``png`` the run's plot."""
    if form != "png":
        path.write_text(render_run(bench, run_id, form))
        return
    from sparkfleet.bench.plots import plot_run  # matplotlib is heavy: load it only to plot

    plot_run(*stored_tiers(bench, run_id), path)
