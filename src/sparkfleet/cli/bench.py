"""``sparkfleet bench decode|prefill|serve|show|compare|export`` (issues 5 and 18).

Runs are stored as they go: a run row first, then each measured tier repeat as soon as it ends,
so Ctrl-C or an endpoint failure keeps everything measured so far, marked ``partial``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sparkfleet.bench.auth import api_key_for
from sparkfleet.bench.corpus import PREFILL_LENGTHS, PROMPT_TYPES, prompt_types
from sparkfleet.cli.app import group
from sparkfleet.cli.console import console, err_console, table, warn
from sparkfleet.cli.extras import require_extra
from sparkfleet.cli.int_lists import parse_int_list
from sparkfleet.cli.options import ApiKeyOpt, ApiOpt, JsonOpt, LabelOpt, ModelOpt, RequestTimeoutOpt, TargetArg
from sparkfleet.errors import BenchError

if TYPE_CHECKING:
    from rich.progress import Progress

    from sparkfleet.bench.client import RequestRecord
    from sparkfleet.bench.report import TierSummary
    from sparkfleet.bench.store import BenchStore

bench_app = group("Decode, prefill and open-loop (serve) benchmarks, history, comparison and export.")
COMMANDS = {"bench": bench_app}


# ---------------------------------------------------------------- option parsing


def parse_extra(text: str | None) -> dict[str, Any]:
    """``--extra-body`` JSON object."""
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise BenchError(f"--extra-body is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise BenchError("--extra-body must be a JSON object, e.g. '{\"top_p\": 1}'")
    return obj


class RichProgress:
    """Progress bars on stderr, one line per finished step."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: Any = None

    def start(self, label: str, total: int) -> None:
        self.task = self.progress.add_task(label, total=total)

    def advance(self, record: RequestRecord) -> None:
        if self.task is not None:
            self.progress.advance(self.task)

    def finish(self, message: str | None) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None
        if message:
            self.progress.console.print(message, highlight=False)


def run_bench(kind: str, config: Any, target: str, model: str | None, api_key: str | None, label: str | None,
              as_json: bool, out: list[Path] | None, max_model_len: int | None = None) -> None:  # fmt: skip
    """One stored bench run of ``sparkfleet bench KIND``: resolve the target, measure config
    (``bench.runs.measure``) with progress bars, then (also when it stopped part way with
    something kept) write the --out files and print the run: as JSON (--json) or, when it
    finished, as a table."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sparkfleet.bench.endpoint import resolve_endpoint
    from sparkfleet.bench.report import render_run, write_run
    from sparkfleet.bench.runs import create_run, measure
    from sparkfleet.bench.store import BenchStore

    formats = out_formats(out)  # checked before any request
    endpoint = resolve_endpoint(target, model, max_model_len=max_model_len, api_key=api_key_for(api_key))
    if getattr(config, "api", None) == "chat" and endpoint.chat_template is False:
        # llama-server's ChatML fallback; vLLM and SGLang refuse such a request, and the probe says so
        from sparkfleet.bench.chat_api import no_template_line

        warn(no_template_line(endpoint.model, endpoint.engine))
    bench = BenchStore()
    run_id = create_run(bench, kind, endpoint, config, label)
    version = f" {endpoint.engine_version}" if endpoint.engine_version else ""
    err_console.print(f"bench {kind} run {run_id}: {endpoint.model} at {endpoint.base_url} "
                      f"({endpoint.engine}{version})")  # fmt: skip
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=err_console, transient=True)  # fmt: skip
    try:
        with bar:
            measure(bench, run_id, endpoint, config, RichProgress(bar), warn=warn, note=err_console.print)
    except KeyboardInterrupt:
        kept = f"partial results kept as run {run_id}" if bench.has_run(run_id) else "nothing was measured"
        err_console.print(f"[yellow]interrupted: {kept}[/]")
        # typer turns KeyboardInterrupt into a return value that the entry point drops, so the
        # conventional exit code is set here (the finally below still writes what was kept).
        sys.exit(130)
    except BenchError:
        if bench.has_run(run_id):
            err_console.print(f"[yellow]results measured so far kept as run {run_id} (partial)[/]")
        raise
    finally:
        if bench.has_run(run_id):
            for path, fmt in formats:
                write_run(bench, run_id, fmt, path)
                err_console.print(f"wrote {path}")
            if as_json:
                typer.echo(render_run(bench, run_id, "json"), nl=False)
    if not as_json:
        _show(bench, run_id)


OUT_FORMATS = {".json": "json", ".csv": "csv", ".md": "md", ".markdown": "md", ".png": "png"}


def out_formats(out: list[Path] | None) -> list[tuple[Path, str]]:
    """Each ``--out`` file with the format its suffix asks for; checked before any request."""
    formats = []
    for path in out or []:
        if path.suffix.lower() not in OUT_FORMATS:
            raise BenchError(f"--out {path}: give a .json, .csv, .md or .png file (the format follows the suffix)")
        formats.append((path, OUT_FORMATS[path.suffix.lower()]))
    if any(fmt == "png" for _, fmt in formats):
        require_extra("plots", ("matplotlib",), "--out FILE.png")
    return formats


# ---------------------------------------------------------------- decode / prefill

ExtraOpt = Annotated[
    str | None,
    typer.Option("--extra-body", help="JSON merged into every request body, e.g. thinking switches."),
]
OutOpt = Annotated[
    list[Path] | None,
    typer.Option("--out", "-o", metavar="FILE",
                 help="Also write the run to this file: .json (every request), .csv, .md or .png, by the suffix "
                 "(repeatable); written also when the run stops part way."),
]  # fmt: skip


@bench_app.command("decode")
def decode_cmd(
    target: TargetArg,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    concurrency: Annotated[str, typer.Option(help="Concurrency tiers.")] = "1,2,4,8,16",
    types: Annotated[str, typer.Option(help=f"Prompt types: {','.join(PROMPT_TYPES)}.")] = ",".join(PROMPT_TYPES),
    output_len: Annotated[int, typer.Option("--output-len", help="New tokens per request (exactly).")] = 256,
    repeats: Annotated[int, typer.Option(help="Measured runs per tier.")] = 3,
    waves: Annotated[int, typer.Option(help="Requests per run = concurrency x waves.")] = 1,
    warmups: Annotated[int, typer.Option(help="Discarded warm-up waves per tier.")] = 1,
    warmup_tokens: Annotated[int, typer.Option(help="Tokens per warm-up request.")] = 32,
    api: ApiOpt = "chat",
    timeout: RequestTimeoutOpt = 600.0,
    extra_body: ExtraOpt = None,
    label: LabelOpt = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Decode throughput: concurrency tiers x prompt types, exactly N new tokens, repeats.

    Aggregate tok/s is measured over the steady window: from the moment every slot is decoding
    (the c-th first token) to the moment the first slot runs dry (the c-th from last last token).
    Per-stream tok/s is (tokens - 1) / (last - first token) of each request. Tokens always come
    from the server's usage, never from counting chunks. Warm-up waves are discarded; a tier
    whose repeats spread more than 10 % is flagged.
    """
    from sparkfleet.bench.decode import DecodeConfig

    config = DecodeConfig(
        concurrency=parse_int_list(concurrency, "concurrency", BenchError),
        prompt_types=prompt_types(types),
        new_tokens=output_len,
        repeats=repeats,
        waves=waves,
        warmups=warmups,
        warmup_tokens=warmup_tokens,
        api=api,  # type: ignore[arg-type]
        timeout=timeout,
        extra_body=parse_extra(extra_body),
    )
    run_bench("decode", config, target, model, api_key, label, as_json, out)


@bench_app.command("prefill")
def prefill_cmd(
    target: TargetArg,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    input_len: Annotated[str, typer.Option("--input-len", help="Prompt lengths in tokens (k = 1024).")] = ",".join(
        f"{n // 1024}k" for n in PREFILL_LENGTHS
    ),
    repeats: Annotated[int, typer.Option(help="Passes over all lengths.")] = 2,
    max_context: Annotated[
        int | None, typer.Option(help="Context limit (default: the server's max_model_len).")
    ] = None,
    overhead_samples: Annotated[int, typer.Option(help="Tiny requests that measure the fixed overhead.")] = 3,
    extra_body: ExtraOpt = None,
    label: LabelOpt = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Cold prefill throughput by prompt length, real text, unique prefix per request.

    Rate = prompt tokens (server usage) / (TTFT - fixed overhead), the overhead being the median
    TTFT of tiny requests; lengths above the model's context are replaced by the context limit;
    a request that reports cached prompt tokens is flagged.
    """
    from sparkfleet.bench.prefill import PrefillConfig

    config = PrefillConfig(
        lengths=parse_int_list(input_len, "prompt length", BenchError),
        repeats=repeats,
        max_context=max_context,
        overhead_samples=overhead_samples,
        extra_body=parse_extra(extra_body),
    )
    run_bench("prefill", config, target, model, api_key, label, as_json, out, max_model_len=max_context)


# ---------------------------------------------------------------- show / compare / export


def flag_cell(tier: TierSummary) -> str:
    """The tier's flags as the last cell of its row."""
    flags = tier.flags()
    return "[yellow]" + ", ".join(flags) + "[/]" if flags else ""


def _show(bench: BenchStore, run_id: int) -> None:
    from sparkfleet.bench.report import fmt, fmt_spread, run_title, stored_tiers

    run, tiers = stored_tiers(bench, run_id)
    if run.kind == "serve":  # figures as median (min–max) over repeats
        shown = table(run_title(run), "rate", "achieved", "req/s", "goodput (share)", "out tok/s",
                      "TPOT p50 ms (engine)", "TTFT p50/p90/p99 ms", "ITL p99", "E2E p50/p99 ms", "KV max", "",
                      left=("rate", ""))  # fmt: skip
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
    elif run.kind == "decode":
        shown = table(run_title(run), "tier", "runs", "aggregate tok/s", "per stream", "TTFT p50 ms", "TPOT p50 ms",
                      "ITL p99 ms", "", left=("tier", ""))  # fmt: skip
        for t in tiers:
            shown.add_row(
                t.tier, str(t.runs), fmt_spread(t.headline), fmt(t.per_stream.median),
                fmt(t.ttft_p50.median, 0), fmt(t.tpot_p50.median), fmt(t.itl_p99.median), flag_cell(t),
            )  # fmt: skip
    else:
        shown = table(run_title(run), "length", "runs", "prompt tokens", "prefill tok/s", "TTFT p50 ms", "", left=("",))
        for t in tiers:
            shown.add_row(
                t.tier, str(t.runs), fmt(t.prompt_tokens.median, 0), fmt_spread(t.headline, 0),
                fmt(t.ttft_p50.median, 0), flag_cell(t),
            )  # fmt: skip
    console.print(shown)
    accept = [t.figures["spec_accept_length"].median for t in tiers if run.kind == "serve"]
    if any(accept):
        console.print(f"speculative decoding: {', '.join(f'{a:.2f}' for a in accept if a)} tokens per step by tier")
    if run.status != "complete":
        console.print(f"[yellow]run {run.id} is {run.status}: {run.note or ''}[/]")


@bench_app.command("show")
def show_cmd(
    run: Annotated[str | None, typer.Argument(help="Run id, 'last' or 'last~N'; none lists runs.")] = None,
    limit: Annotated[int, typer.Option(help="How many runs to list.")] = 20,
) -> None:
    """List stored runs, or show one run's tiers."""
    from sparkfleet.bench.store import BenchStore

    bench = BenchStore()
    if run is not None:
        _show(bench, bench.resolve(run))
        return
    shown = table("bench runs", "id", "kind", "status", "created (UTC)", "model", "engine", "target", "label")
    for r in bench.list_runs(limit):
        shown.add_row(
            str(r.id), r.kind, r.status, r.created_at, r.model or "",
            f"{r.engine or ''} {r.engine_version or ''}", r.deployment or r.endpoint, r.label or "",
        )  # fmt: skip
    console.print(shown)


COMPARED = (
    ("output tok/s", "output_throughput", 1),
    ("goodput /s", "goodput", 2),
    ("achieved /s", "achieved_rate", 2),
    ("TTFT p50 ms", "ttft_p50", 0),
    ("TPOT p50 ms", "tpot_p50", 1),
    ("E2E p99 ms", "e2el_p99", 0),
)


@bench_app.command("compare")
def compare_cmd(
    a: Annotated[str, typer.Argument(help="Baseline run (id, 'last~1', …).")],
    b: Annotated[str, typer.Argument(help="Run compared with it.")],
) -> None:
    """Per tier: both medians, the ratio B/A, and whether the difference exceeds the runs' spread."""
    from sparkfleet.bench.report import compare, fmt, fmt_spread, stored_tiers
    from sparkfleet.bench.store import BenchStore

    bench = BenchStore()
    run_a, tiers_a = stored_tiers(bench, bench.resolve(a))
    run_b, tiers_b = stored_tiers(bench, bench.resolve(b))
    if run_a.kind != run_b.kind:
        raise BenchError(f"run {run_a.id} is {run_a.kind} and run {run_b.id} is {run_b.kind}: compare like with like")
    if run_a.kind == "serve":  # per common rate tier and figure
        shown = table(f"rate tiers: A = run {run_a.id}, B = run {run_b.id}", "rate", "figure", "A median (min–max)",
                      "B median (min–max)", "B/A", "verdict", left=("rate", "figure", "verdict"))  # fmt: skip
        for name, key, digits in COMPARED:
            for row in compare(tiers_a, tiers_b, figure=key):
                if row.a.median is None and row.b.median is None:
                    continue
                verdict = "different" if row.exceeds_spread else "within spread"
                shown.add_row(row.tier, name, fmt_spread(row.a, digits), fmt_spread(row.b, digits),
                              fmt(row.ratio, 3), verdict)  # fmt: skip
        if not shown.row_count:
            raise BenchError(f"runs {run_a.id} and {run_b.id} have no rate tier in common")
        console.print(shown)
        dirty = [f"{r.id}:{t.tier}" for r, ts in ((run_a, tiers_a), (run_b, tiers_b)) for t in ts if t.foreign_requests]
        if dirty:
            console.print(f"[yellow]foreign requests ran in {', '.join(dirty)}: those figures are not clean[/]")
        return
    rows = compare(tiers_a, tiers_b)
    if not rows:
        raise BenchError(f"runs {run_a.id} and {run_b.id} have no tier in common")
    what = "aggregate tok/s" if run_a.kind == "decode" else "prefill tok/s"
    shown = table(f"{what}: A = run {run_a.id}, B = run {run_b.id}", "tier", "A median (min–max)",
                  "B median (min–max)", "B/A", "verdict", left=("tier", "verdict"))  # fmt: skip
    for row in rows:
        verdict = (
            ("[green]faster[/]" if (row.ratio or 1) > 1 else "[red]slower[/]")
            if row.exceeds_spread
            else "within spread"
        )
        shown.add_row(row.tier, fmt_spread(row.a), fmt_spread(row.b), fmt(row.ratio, 3), verdict)
    console.print(shown)


@bench_app.command("export")
def export_cmd(
    run: Annotated[str, typer.Argument(help="Run id, 'last' or 'last~N'.")],
    fmt_: Annotated[str, typer.Option("--format", "-f", help="json, csv, md or png.")] = "json",
    out: Annotated[
        Path | None, typer.Option("--out", "-o", metavar="FILE", help="File to write (default: stdout).")
    ] = None,
) -> None:
    """Export a run: JSON (vLLM key names where they exist), CSV, Markdown tables, or a PNG plot."""
    from sparkfleet.bench.report import render_run, write_run
    from sparkfleet.bench.store import BenchStore

    if fmt_ == "png":
        require_extra("plots", ("matplotlib",), "--format png")
    elif fmt_ not in ("json", "csv", "md", "markdown"):
        raise BenchError(f"unknown export format {fmt_!r}: choose json, csv, md or png")
    bench = BenchStore()
    run_id = bench.resolve(run)
    if out is None and fmt_ != "png":
        console.file.write(render_run(bench, run_id, fmt_))
    else:  # a plot is always a file: bench-ID-KIND.png without --out
        out = out or Path(f"bench-{run_id}-{bench.get_run(run_id).kind}.png")
        write_run(bench, run_id, fmt_, out)
        err_console.print(f"wrote {out}")


# ---------------------------------------------------------------- serve (issue 18)


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
    from sparkfleet.bench.workload import Lengths, WorkloadConfig, dataset_of

    if num_prompts is not None and duration is not None:
        raise BenchError("give --num-prompts or --duration, not both")
    workload = WorkloadConfig(dataset=dataset_of(dataset_name, dataset_path),
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
