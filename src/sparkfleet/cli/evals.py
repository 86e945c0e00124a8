"""``sparkfleet eval quality|compare|needle|show`` (issue 6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sparkfleet.bench.auth import api_key_for
from sparkfleet.cli.app import group
from sparkfleet.cli.console import console, err_console, plain, table
from sparkfleet.cli.extras import require_extra
from sparkfleet.cli.int_lists import parse_int_list
from sparkfleet.cli.options import ApiKeyOpt, JsonOpt, LabelOpt, ModelOpt, TargetArg, out_files
from sparkfleet.errors import EvalError
from sparkfleet.evals.checks import CATEGORIES
from sparkfleet.evals.needle import DEFAULT_DEPTHS, DEFAULT_LENGTHS

if TYPE_CHECKING:
    from sparkfleet.evals.needle import NeedleRun
    from sparkfleet.evals.results import QualityRun, TaskResult

eval_app = group("Quality gate, paired comparison and long-context needle checks.")
COMMANDS = {"eval": eval_app}


def _write_json(result: dict[str, Any], paths: list[Path] | None) -> None:
    for path in paths or []:
        path.write_text(json.dumps(result, indent=2))
        err_console.print(f"wrote {path}")


def _csv(text: str | None) -> list[str] | None:
    return [p.strip() for p in text.split(",") if p.strip()] if text else None


def _mark(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]FAIL[/]"


def _print_result_line(i: int, total: int, r: TaskResult) -> None:
    toks = r.completion_tokens if r.completion_tokens is not None else "?"
    err_console.print(
        f"[{i + 1:>2}/{total}] {_mark(r.passed)} {r.id:<28} {r.seconds:6.1f}s {toks:>5} tok "
        f"{r.finish_reason:<6} {r.why[:70]}",
        highlight=False,
    )


def _print_quality(run: QualityRun) -> None:
    """Per-category tallies of a run, then how it was run."""
    tallies = table(f"{run.label}: {run.passed}/{run.total} passed ({100 * run.passed / run.total:.0f}%)",
                    "category", "passed", "total", left=("category",), title_justify="center")  # fmt: skip
    for cat, (ok, n) in run.by_category().items():
        tallies.add_row(cat, str(ok), str(n))
    console.print(tallies)
    tok_s = run.median_tok_s()
    speed = f", median {tok_s:.1f} tok/s" if tok_s else ""
    sandbox_style = "" if run.sandbox.startswith(("root", "userns")) and "NOT" not in run.sandbox else "[red]"
    console.print(
        f"run {run.id}  model {run.model}  engine {run.engine}\n"
        f"prompt format: {run.prompt_format}\nthinking: {run.thinking_control}\n"
        f"sandbox: {sandbox_style}{run.sandbox}{'[/]' if sandbox_style else ''}\n"
        f"wall {run.wall_s / 60:.1f} min, {run.truncated} answers cut at max_tokens{speed}",
        highlight=False,
    )


@eval_app.command("quality")
def quality(
    target: TargetArg,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    label: LabelOpt = None,
    categories: Annotated[str | None, typer.Option(help=f"Only these ({','.join(CATEGORIES)}).")] = None,
    only: Annotated[str | None, typer.Option(help="Only these task ids (comma-separated).")] = None,
    tasks_dir: Annotated[Path | None, typer.Option("--tasks", help="A directory of task TOML files.")] = None,
    api: Annotated[str, typer.Option(help="auto | chat | completions.")] = "auto",
    thinking_budget: Annotated[
        int, typer.Option(help="Extra max_tokens for thinking tasks on chat endpoints (thinking models).")
    ] = 0,
    timeout: Annotated[float, typer.Option(help="Seconds per request.")] = 600.0,
    as_json: JsonOpt = False,
    out: Annotated[list[Path] | None, out_files("Also write the full result (JSON) to this file (repeatable).")] = None,
    gate: Annotated[
        float | None,
        typer.Option(
            help="Pass fraction the deployment's gate needs (default: no fewer than its last passing "
            "configuration's quality run)."
        ),
    ] = None,
    unsafe_unconfined_code: Annotated[
        bool,
        typer.Option(
            "--unsafe-unconfined-code",
            help="Run code tasks even where the sandbox gets no namespaces: the model's code can then write "
            "this user's files and reach the network.",
        ),
    ] = False,
) -> None:
    """Run the auto-scored quality tasks (temperature 0, one request at a time) and store the result.
    Against a deployment name, the result joins that configuration's gate (see `sparkfleet rollback`)."""
    from sparkfleet.bench.endpoint import resolve_endpoint
    from sparkfleet.evals.runner import run_stored
    from sparkfleet.evals.sandbox import SandboxLimits
    from sparkfleet.evals.tasks import load_tasks
    from sparkfleet.state.store import Store

    if api not in ("auto", "chat", "completions"):
        raise EvalError(f"--api must be auto, chat or completions, not {api!r}")
    tasks = load_tasks(tasks_dir, categories=_csv(categories), ids=_csv(only))
    endpoint = resolve_endpoint(target, model, api_key=api_key_for(api_key))
    run = run_stored(endpoint, tasks, label=label or "", timeout=timeout, api_choice=api,  # type: ignore[arg-type]
                     thinking_budget=thinking_budget, limits=SandboxLimits(unconfined_ok=unsafe_unconfined_code),
                     on_result=lambda i, r: _print_result_line(i, len(tasks), r))  # fmt: skip
    _write_json(run.to_json(), out)
    if as_json:
        typer.echo(json.dumps(run.to_json(), indent=2))
    else:
        _print_quality(run)
    if endpoint.deployment is not None:
        from sparkfleet.apply.configurations import quality_gate

        line = quality_gate(Store(), endpoint.deployment, run.passed, run.total, run.id, gate)
        if line:  # with --json, stdout holds the JSON alone
            plain(line, err=as_json)


@eval_app.command("compare")
def compare(
    a: Annotated[str, typer.Argument(help="Baseline run: id, label or result JSON file.")],
    b: Annotated[str, typer.Argument(help="Candidate run: id, label or result JSON file.")],
) -> None:
    """Pair two quality runs task by task: flips, exact McNemar p per block, and a verdict."""
    from sparkfleet.evals.compare import compare_runs
    from sparkfleet.evals.results import QualityRun
    from sparkfleet.evals.store import load_run
    from sparkfleet.state.store import Store

    store = Store()
    run_a = QualityRun.from_json(load_run(store, a, "quality"))
    run_b = QualityRun.from_json(load_run(store, b, "quality"))
    cmp = compare_runs(run_a, run_b)
    blocks = table(f"A = {cmp.a}   B = {cmp.b}   ({cmp.paired} paired tasks)", "block", "categories", "both pass",
                   "broke", "fixed", "both fail", "McNemar p", left=("block", "categories"),
                   title_justify="center")  # fmt: skip
    for blk in cmp.blocks:
        blocks.add_row(blk.name, "+".join(blk.categories), str(blk.both_pass), str(blk.broke), str(blk.fixed),
                       str(blk.both_fail), f"{blk.p:.3g}")  # fmt: skip
    console.print(blocks)
    for f in cmp.flips:
        colour = "red" if f.direction == "broke" else "green"
        console.print(f"  [{colour}]{f.direction.upper():<5}[/] {f.id:<28} {f.why[:80]}", highlight=False)
    for side, ids in (("A", cmp.only_in_a), ("B", cmp.only_in_b)):
        if ids:
            more = f" and {len(ids) - 5} more" if len(ids) > 5 else ""
            console.print(f"unpaired, only in {side}: {len(ids)} tasks ({', '.join(ids[:5])}{more})", highlight=False)
    console.print(f"[bold]verdict:[/] {cmp.verdict}", highlight=False)


def _print_needle(run: NeedleRun, png: Path | None) -> None:
    grid = table(f"needle {run.label}: effective length {run.effective_length or 'none'} tokens", "tokens \\ depth %",
                 title_justify="center")  # fmt: skip
    for d in run.depths:
        grid.add_column(f"{d:g}", justify="center")
    for length in run.lengths:
        cells = []
        for d in run.depths:
            cell = run.cell(length, d)
            cells.append("[green]✓[/]" if cell and cell.passed else "[red]✗[/]" if cell else "-")
        grid.add_row(str(length), *cells)
    console.print(grid)
    console.print(f"run {run.id}  token counts: {run.token_counting}  wall {run.wall_s:.0f}s", highlight=False)
    if png:
        console.print(f"heatmap: {png}")


@eval_app.command("needle")
def needle(
    target: TargetArg,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    label: LabelOpt = None,
    input_len: Annotated[
        str, typer.Option(help="Prompt lengths in tokens, comma-separated (k = 1024); capped at the context.")
    ] = ",".join(str(x) for x in DEFAULT_LENGTHS),
    depths: Annotated[str, typer.Option(help="Needle depths in percent, comma-separated.")] = ",".join(
        f"{d:g}" for d in DEFAULT_DEPTHS
    ),
    seed: Annotated[int | None, typer.Option(help="Seed for needles and offsets (default: random, stored).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds per request.")] = 1800.0,
    mem_floor: Annotated[
        float,
        typer.Option(help="Abort the server's requests when MemAvailable on a node drops below this (GiB)."),
    ] = 0.0,
    cluster: Annotated[
        Path | None,
        typer.Option(
            "--cluster", "-c", help="Cluster file whose nodes the memory guard watches (default: this machine)."
        ),
    ] = None,
    as_json: JsonOpt = False,
    out: Annotated[
        list[Path] | None,
        out_files(
            "Also write the result to this file: the heatmap for .png (needs matplotlib), else JSON (repeatable)."
        ),
    ] = None,
) -> None:
    """Needle-in-a-haystack over a length x depth grid; exact-match scoring; effective length."""
    from sparkfleet.evals.needle import run_stored

    pngs = [p for p in out or [] if p.suffix.lower() == ".png"]
    if pngs:
        require_extra("plots", ("matplotlib",), "--out FILE.png")
    run = run_stored(
        target, model, api_key=api_key_for(api_key), lengths=parse_int_list(input_len, "length", EvalError),
        depths=tuple(float(d) for d in parse_int_list(depths, "depth", EvalError, minimum=0)), seed=seed,
        label=label, timeout=timeout, mem_floor_gib=mem_floor, cluster=str(cluster) if cluster else None,
        on_cell=lambda c: err_console.print(f"{c.tokens:>7} tok @ {c.depth:>5g}%  {_mark(c.passed)}  "
                                            f"{c.seconds:6.1f}s  expected {c.expected}  got {c.answer[:40]!r}",
                                            highlight=False),
    )  # fmt: skip
    if pngs:
        # matplotlib is heavy; imported only when a heatmap is asked for.
        from sparkfleet.evals.heatmap import write_heatmap

        for png in pngs:
            write_heatmap(run, png)
    _write_json(run.to_json(), [p for p in out or [] if p not in pngs])
    if as_json:
        typer.echo(json.dumps(run.to_json(), indent=2))
    else:
        _print_needle(run, pngs[0] if pngs else None)


@eval_app.command("show")
def show(
    run: Annotated[str | None, typer.Argument(help="Run id or label; omit to list runs.")] = None,
    failures: Annotated[bool, typer.Option(help="List failed tasks with their reasons.")] = True,
) -> None:
    """List stored eval runs, or show one."""
    from sparkfleet.evals.needle import NeedleRun
    from sparkfleet.evals.results import QualityRun
    from sparkfleet.evals.store import list_runs, load_run
    from sparkfleet.state.store import Store

    store = Store()
    if run is None:
        rows = list_runs(store)
        if not rows:
            console.print("no eval runs stored yet")
            return
        listed = table("eval runs", "id", "kind", "label", "model", "created (UTC)", "score", title_justify="center")
        for r in rows:
            listed.add_row(r.id, r.kind, r.label, r.model[-40:], r.created_utc, f"{r.passed}/{r.total}")
        console.print(listed)
        return
    data = load_run(store, run)
    if "results" in data:
        q = QualityRun.from_json(data)
        _print_quality(q)
        if failures:
            for res in q.results:
                if not res.passed:
                    console.print(f"  [red]FAIL[/] {res.id:<28} {res.why[:90]}", highlight=False)
    else:
        _print_needle(NeedleRun.from_json(data), None)
