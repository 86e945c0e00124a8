"""``sparkfleet bench serve``: open-loop load at asked request rates (issue 18), and how stored
serve runs are shown and compared (``bench show`` / ``bench compare`` call in here for them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sparkfleet.cli.bench import ExtraOpt, OutOpt, bench_app, flag_cell, parse_extra, run_bench
from sparkfleet.cli.console import console, table
from sparkfleet.cli.options import ApiKeyOpt, ApiOpt, JsonOpt, LabelOpt, ModelOpt, RequestTimeoutOpt, TargetArg
from sparkfleet.errors import BenchError

if TYPE_CHECKING:
    from sparkfleet.bench.report import TierSummary
    from sparkfleet.bench.stats import Spread
    from sparkfleet.bench.store import StoredRun

# The whole bench group: this module's command and cli/bench.py's, which it imports.
COMMANDS = {"bench": bench_app}


@bench_app.command("serve")
def serve_cmd(
    target: TargetArg,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    request_rate: Annotated[str, typer.Option(help="Requests/s; a sweep as 1,2,4,inf (inf = all at once).")] = "inf",
    burstiness: Annotated[
        str, typer.Option(help="Gamma shape of the gaps: 1 = Poisson, <1 burstier, inf = constant rate.")
    ] = "1",
    constant: Annotated[bool, typer.Option("--constant", help="Constant gaps (same as --burstiness inf).")] = False,
    max_concurrency: Annotated[int | None, typer.Option(help="At most this many requests in flight.")] = None,
    num_prompts: Annotated[int | None, typer.Option("--num-prompts", help="Requests per tier (default 100).")] = None,
    duration: Annotated[
        float | None, typer.Option(help="Seconds of arrivals per tier, instead of --num-prompts.")
    ] = None,
    input_len: Annotated[str, typer.Option(help="Prompt tokens: 256, or uniform 128:512.")] = "256",
    output_len: Annotated[
        str, typer.Option(help="New tokens: 128, or uniform 64:256 (exact when the engine can).")
    ] = "128",
    dataset_name: Annotated[
        str | None,
        typer.Option(
            "--dataset-name",
            help="random (default), prefix (shared system prompt), multiturn, or custom "
            "(a .jsonl file: --dataset-path).",
        ),
    ] = None,
    dataset_path: Annotated[Path | None, typer.Option(help="A .jsonl file of requests (the custom dataset).")] = None,
    prefix_len: Annotated[int, typer.Option(help="Shared system prompt tokens (--dataset-name prefix).")] = 512,
    turns: Annotated[int, typer.Option(help="Turns per conversation (--dataset-name multiturn).")] = 3,
    goodput: Annotated[
        str | None,
        typer.Option(
            "--goodput",
            help="SLO targets a good request meets, e.g. ttft=1s,tpot=50ms,e2e=20s, or vLLM's ttft:1000 tpot:50 (ms).",
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Measured runs per rate.")] = 1,
    discard_runs: Annotated[int, typer.Option(help="Runs thrown away before the first tier (cold caches).")] = 2,
    strict: Annotated[bool, typer.Option("--strict", help="Abort when foreign requests ran during a tier.")] = False,
    engine_log: Annotated[
        Path | None, typer.Option(help="SGLang log to read #running-req from when /metrics has no gauge.")
    ] = None,
    no_metrics: Annotated[bool, typer.Option("--no-metrics", help="Do not poll the engine's /metrics.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of arrivals, lengths and texts.")] = 0,
    api: ApiOpt = "chat",
    timeout: RequestTimeoutOpt = 600.0,
    extra_body: ExtraOpt = None,
    label: LabelOpt = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Open-loop load: requests arrive at an asked rate (Poisson, gamma or constant), not when a
    slot frees; a sweep of rates, goodput under SLOs, and a check that nothing else ran.

    Per tier: the achieved rate beside the asked one, req/s, goodput (requests meeting every
    --goodput target per second), output tok/s next to TPOT (client and engine), p50/p90/p99 of TTFT,
    TPOT, ITL and E2E, KV-cache use, speculative acceptance when exported, and foreign requests:
    the most requests the engine reported running beyond the bench's own (flagged; --strict aborts).
    """
    from sparkfleet.bench.arrivals import parse_burstiness, parse_rates
    from sparkfleet.bench.serve import ServeConfig
    from sparkfleet.bench.stats import SLO
    from sparkfleet.bench.workload import Lengths, WorkloadConfig

    if num_prompts is not None and duration is not None:
        raise BenchError("give --num-prompts or --duration, not both")
    workload = WorkloadConfig(dataset=_dataset(dataset_name, dataset_path),
                              input_len=Lengths.parse(input_len, "--input-len"),
                              output_len=Lengths.parse(output_len, "--output-len"), prefix_len=prefix_len,
                              turns=turns)  # fmt: skip
    config = ServeConfig(
        rates=parse_rates(request_rate), burstiness=parse_burstiness(burstiness, constant),
        max_concurrency=max_concurrency,
        requests=num_prompts if num_prompts is not None or duration is not None else 100,
        duration=duration, workload=workload, slo=SLO.parse(goodput), repeats=repeats, discard_runs=discard_runs,
        strict=strict, seed=seed, api=api,  # type: ignore[arg-type]
        timeout=timeout, watch_metrics=not no_metrics, engine_log=str(engine_log) if engine_log else None,
        extra_body=parse_extra(extra_body),
    )  # fmt: skip
    run_bench("serve", config, target, model, api_key, label, as_json, out)


def _dataset(name: str | None, path: Path | None) -> str:
    """The workload's dataset: a name, or the file of the custom one."""
    if path is not None:
        if name not in (None, "custom"):
            raise BenchError(f"--dataset-path is the custom dataset's file: drop --dataset-name {name} or give custom")
        return str(path)
    if name == "custom":
        raise BenchError("--dataset-name custom reads a .jsonl file: give it with --dataset-path FILE")
    return name or "random"


def show_serve(run: StoredRun, tiers: list[TierSummary]) -> None:
    """The rate tiers as a table, figures shown as median (min–max) over repeats (``bench show``
    then adds the run's status)."""
    from sparkfleet.bench.report import fmt, fmt_spread, run_title

    shown = table(run_title(run), "rate", "achieved", "req/s", "goodput (share)", "out tok/s", "TPOT p50 ms (engine)",
                  "TTFT p50/p90/p99 ms", "ITL p99", "E2E p50/p99 ms", "KV max", "", left=("rate", ""))  # fmt: skip
    for t in tiers:
        f = t.figures
        good = f["goodput"]
        share = f["good_share"].median
        kv = f["kv_usage_max"].median
        shown.add_row(
            t.tier, fmt(f["achieved_rate"].median, 2), fmt(f["request_throughput"].median, 2),
            "–" if good.median is None else f"{fmt_spread(good, 2)} ({100 * (share or 0):.0f}%)",
            fmt_spread(f["output_throughput"]),
            f"{fmt(f['tpot_p50'].median)} ({fmt(f['server_tpot_ms'].median)})",
            f"{fmt(f['ttft_p50'].median, 0)}/{fmt(f['ttft_p90'].median, 0)}/{fmt(f['ttft_p99'].median, 0)}",
            fmt(f["itl_p99"].median), f"{fmt(f['e2el_p50'].median, 0)}/{fmt(f['e2el_p99'].median, 0)}",
            "–" if kv is None else f"{100 * kv:.0f}%", flag_cell(t),
        )  # fmt: skip
    console.print(shown)
    accept = [t.figures["spec_accept_length"].median for t in tiers if t.figures["spec_accept_length"].median]
    if accept:
        console.print(f"speculative decoding: {', '.join(f'{a:.2f}' for a in accept)} tokens per step by tier")


COMPARED = (
    ("output tok/s", "output_throughput", 1),
    ("goodput /s", "goodput", 2),
    ("achieved /s", "achieved_rate", 2),
    ("TTFT p50 ms", "ttft_p50", 0),
    ("TPOT p50 ms", "tpot_p50", 1),
    ("E2E p99 ms", "e2el_p99", 0),
)


def _figure(key: str) -> Callable[[TierSummary], Spread]:
    return lambda t: t.figures[key]


def compare_serve(run_a: StoredRun, tiers_a: list[TierSummary], run_b: StoredRun, tiers_b: list[TierSummary]) -> None:
    """Per common rate tier and figure: both medians, B/A, and whether it exceeds the spread."""
    from sparkfleet.bench.report import compare, fmt, fmt_spread

    shown = table(f"rate tiers: A = run {run_a.id}, B = run {run_b.id}", "rate", "figure", "A median (min–max)",
                  "B median (min–max)", "B/A", "verdict", left=("rate", "figure", "verdict"))  # fmt: skip
    rows = 0
    for name, key, digits in COMPARED:
        for row in compare(tiers_a, tiers_b, figure=_figure(key)):
            if row.a.median is None and row.b.median is None:
                continue
            rows += 1
            verdict = "different" if row.exceeds_spread else "within spread"
            shown.add_row(row.tier, name, fmt_spread(row.a, digits), fmt_spread(row.b, digits),
                          fmt(row.ratio, 3), verdict)  # fmt: skip
    if not rows:
        raise BenchError(f"runs {run_a.id} and {run_b.id} have no rate tier in common")
    console.print(shown)
    dirty = [f"{r.id}:{t.tier}" for r, ts in ((run_a, tiers_a), (run_b, tiers_b)) for t in ts if t.foreign_requests]
    if dirty:
        console.print(f"[yellow]foreign requests ran in {', '.join(dirty)}: those figures are not clean[/]")
