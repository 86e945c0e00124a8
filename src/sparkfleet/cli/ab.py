"""``sparkfleet ab RECIPE --variants A,B``: alternating rounds of two variants, one report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from sparkfleet.cli.console import err_console, plain
from sparkfleet.cli.int_lists import parse_int_list
from sparkfleet.cli.options import ClusterOpt, EnvOpt, JsonOpt, NameOpt, RecipeArg, SetOpt, out_files, parse_env
from sparkfleet.errors import BenchError, SparkfleetError, UsageError


def ab(
    recipe: RecipeArg,
    variants: Annotated[str, typer.Option("--variants", help="Two variants, A,B (base is the recipe as written).")],
    cluster: ClusterOpt = None,
    rounds: Annotated[int, typer.Option(help="Rounds; each runs both variants, in alternating order.")] = 3,
    bench: Annotated[str, typer.Option("--bench", help="decode, prefill or decode,prefill (or none).")] = "decode",
    concurrency: Annotated[str, typer.Option(help="Decode concurrency tiers.")] = "1",
    types: Annotated[str, typer.Option("--types", help="Decode prompt types.")] = "prose",
    output_len: Annotated[int, typer.Option("--output-len", help="Decode: new tokens per request (exactly).")] = 128,
    repeats: Annotated[int, typer.Option(help="Measured runs per tier and round.")] = 3,
    warmups: Annotated[int, typer.Option(help="Decode: discarded warm-up waves per tier.")] = 1,
    api: Annotated[str, typer.Option(help="Decode: chat or completions.")] = "chat",
    input_len: Annotated[str, typer.Option("--input-len", help="Prefill: prompt lengths (k = 1024).")] = "1k,4k",
    eval_: Annotated[str | None, typer.Option("--eval", help="quality: run the quality tasks each round.")] = None,
    categories: Annotated[str | None, typer.Option(help="Quality: only these categories.")] = None,
    only: Annotated[str | None, typer.Option(help="Quality: only these task ids (comma-separated).")] = None,
    min_effect: Annotated[float, typer.Option(help="Smallest difference (%) a verdict may name.")] = 5.0,
    timeout: Annotated[float | None, typer.Option(help="Seconds to wait for each up's readiness.")] = None,
    name: NameOpt = None,
    set_: SetOpt = None,
    env: EnvOpt = None,
    as_json: JsonOpt = False,
    out: Annotated[
        list[Path] | None, out_files("Also write the report to this file: Markdown for .md, else JSON (repeatable).")
    ] = None,
) -> None:
    """A/B two variants of a recipe: every round brings each one up (verify + smoke), runs the
    benches (and quality tasks), and takes it down; A B, then B A, … . The report gives each
    metric for both, its spread, the difference in % and a verdict by the stated rule."""
    from sparkfleet.bench.corpus import prompt_types
    from sparkfleet.bench.decode import DecodeConfig
    from sparkfleet.bench.prefill import PrefillConfig
    from sparkfleet.experiments.report import markdown
    from sparkfleet.experiments.runner import ABConfig, run_ab

    pair = tuple(v.strip() for v in variants.split(","))
    if len(pair) != 2 or not all(pair):
        raise UsageError(f"--variants {variants!r}: give exactly two, e.g. --variants base,fast")
    kinds = {k.strip() for k in bench.split(",") if k.strip() and k.strip() != "none"}
    if kinds - {"decode", "prefill"}:
        raise UsageError(f"--bench {bench!r}: choose decode, prefill or decode,prefill")
    if eval_ not in (None, "quality"):
        raise UsageError(f"--eval {eval_!r}: only quality runs inside an A/B")
    decode = DecodeConfig(concurrency=parse_int_list(concurrency, "concurrency", SparkfleetError),
                          prompt_types=prompt_types(types), new_tokens=output_len, repeats=repeats, warmups=warmups,
                          api=api) if "decode" in kinds else None  # type: ignore[arg-type]  # fmt: skip
    prefill = PrefillConfig(lengths=parse_int_list(input_len, "prompt length", SparkfleetError),
                            repeats=repeats) if "prefill" in kinds else None  # fmt: skip
    config = ABConfig(
        recipe=recipe, variants=(pair[0], pair[1]), rounds=rounds, cluster=cluster, name=name,
        sets=tuple(set_ or ()), env=parse_env(env), decode=decode, prefill=prefill, quality=eval_ == "quality",
        quality_categories=tuple(c.strip() for c in categories.split(",")) if categories else None,
        quality_ids=tuple(c.strip() for c in only.split(",")) if only else None,
        min_effect=min_effect / 100.0, timeout=timeout,
    )  # fmt: skip
    report = run_ab(config, say=lambda line: plain(line, err=True))
    text = markdown(report)
    for path in out or []:
        is_md = path.suffix.lower() in (".md", ".markdown")
        path.write_text(text if is_md else json.dumps(report, indent=2))
        err_console.print(f"wrote {path}")
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        plain(text)
    if report["status"] == "interrupted":
        err_console.print(f"[yellow]interrupted: {report['rounds']} finished round(s) kept as experiment "
                          f"{report['experiment']}[/]")  # fmt: skip
        sys.exit(130)
    if report["status"] == "failed":
        raise BenchError(f"experiment {report['experiment']} stopped: {report['note']}")


COMMANDS = {"ab": ab}
