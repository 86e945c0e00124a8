"""One spelling per concept in every command, `vllm bench serve`'s where it has one; `--json` a
flag everywhere; the old spellings kept as deprecated aliases (cli/renamed.py, issue 36)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperGroup

from sparkfleet.cli.main import build_app
from sparkfleet.cli.renamed import JSON_WAS_A_FILE, RENAMED, rewrite
from tests.cli_run import run_main
from tests.replay_server import ReplayServer, Script

# concept → (the one allowed spelling, spellings of the same concept that no command may use:
# sparkfleet's old ones, vLLM's and other tools' synonyms).
CONCEPTS: dict[str, tuple[str, frozenset[str]]] = {
    "new tokens per request": ("--output-len", frozenset({"--tokens", "--new-tokens", "--random-output-len",
                                                          "--osl", "--output-tokens", "--num-tokens"})),
    "prompt tokens per request": ("--input-len", frozenset({"--lengths", "--length", "--prompt-len",
                                                            "--random-input-len", "--isl", "--input-tokens",
                                                            "--prompt-lengths"})),
    "requests per run": ("--num-prompts", frozenset({"--requests", "--num-requests", "--n-requests"})),
    "goodput targets": ("--goodput", frozenset({"--slo", "--slos"})),
    "dataset": ("--dataset-name", frozenset({"--dataset"})),
    "dataset file": ("--dataset-path", frozenset({"--dataset-file"})),
    "arrival rate": ("--request-rate", frozenset({"--rate", "--qps", "--rps"})),
    "in-flight cap": ("--max-concurrency", frozenset({"--max-inflight", "--max-concurrent"})),
    "random seed": ("--seed", frozenset({"--random-seed"})),
    "model id": ("--model", frozenset({"--model-id", "--served-model-name", "--model-name"})),
    "run label": ("--label", frozenset({"--run-name", "--tag"})),
    "measured repeats": ("--repeats", frozenset({"--runs", "--repetitions", "--num-runs"})),
    "extra request body": ("--extra-body", frozenset({"--extra", "--body"})),
    "which OpenAI API": ("--api", frozenset({"--endpoint", "--backend", "--api-type"})),
    "server API key": ("--api-key", frozenset({"--key"})),
    "cluster file": ("--cluster", frozenset({"--cluster-file", "--inventory"})),
    "a file written": ("--out", frozenset({"--output", "--output-file", "--output-json", "--result-filename",
                                           "--result-dir", "--save-result", "--md", "--png", "--json-out"})),
}  # fmt: skip
# Where a spelling has a short form, it is the same one in every command.
SHORT = {"--out": "-o", "--cluster": "-c"}


def _walk(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = []
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            found += _walk(sub, (*path, name))
    else:
        found.append((path, command))
    return found


COMMANDS = _walk(typer.main.get_command(build_app()))


def _options(command: Any) -> list[Any]:
    return [p for p in command.params if p.param_type_name == "option" and not p.hidden and p.name != "help"]


def _longs(option: Any) -> list[str]:
    return [o for o in [*option.opts, *option.secondary_opts] if o.startswith("--")]


def test_every_command_spells_each_concept_the_one_way() -> None:
    wrong = []
    for path, command in COMMANDS:
        for option in _options(command):
            for spelling in _longs(option):
                for concept, (allowed, others) in CONCEPTS.items():
                    if spelling in others:
                        wrong.append(f"sparkfleet {' '.join(path)} {spelling}: {concept} is spelled {allowed}")
    assert not wrong, "\n".join(wrong)


def test_json_is_a_flag_everywhere_and_one_spelling_is_one_kind_of_option() -> None:
    kinds: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    shorts: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path, command in COMMANDS:
        where = " ".join(path)
        for option in _options(command):
            kind = "flag" if option.is_flag else "value"
            for spelling in _longs(option):
                kinds[spelling][kind].append(where)
                short = ",".join(sorted(o for o in option.opts if not o.startswith("--")))
                shorts[spelling][short].append(where)
    assert set(kinds["--json"]) == {"flag"}, dict(kinds["--json"])
    assert len(kinds["--json"]["flag"]) >= 12  # plan, status, stage, doctor, gateway, bench, eval, ab
    mixed = {s: dict(k) for s, k in kinds.items() if len(k) > 1}
    assert not mixed, f"a spelling that takes a value in some commands and is a flag in others: {mixed}"
    for spelling, short in SHORT.items():
        assert set(shorts[spelling]) == {short}, (spelling, dict(shorts[spelling]))
    for path in JSON_WAS_A_FILE:
        command = dict(COMMANDS)[path]
        assert {"--json", "--out"} <= {s for o in _options(command) for s in _longs(o)}, path


def test_every_old_spelling_names_an_option_its_command_has() -> None:
    commands = dict(COMMANDS)
    for path, rules in RENAMED.items():
        spellings = {s for o in _options(commands[path]) for s in _longs(o)}
        for old, rule in rules.items():
            assert old not in spellings, f"{path} {old} is still a visible option"
            news = {rule} if isinstance(rule, str) else {rule("x.jsonl")[0], rule("x.md")[0], rule("x.png")[0]}
            assert (news - {None}) <= spellings and news - {None}, (path, old, news)


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["bench", "decode", "U", "--tokens", "8"], ["bench", "decode", "U", "--output-len", "8"]),
        (["bench", "decode", "U", "--tokens=8"], ["bench", "decode", "U", "--output-len=8"]),
        (["bench", "serve", "U", "--dataset", "prefix"], ["bench", "serve", "U", "--dataset-name", "prefix"]),
        (["bench", "serve", "U", "--dataset", "r.jsonl"], ["bench", "serve", "U", "--dataset-path", "r.jsonl"]),
        (["ab", "R", "--md", "r.md", "--lengths", "1k"], ["ab", "R", "--out", "r.md", "--input-len", "1k"]),
        (["bench", "serve", "U", "--", "--requests"], ["bench", "serve", "U", "--", "--requests"]),
        (["plan", "R", "--tokens", "8"], ["plan", "R", "--tokens", "8"]),  # not an old spelling there
    ],
)
def test_rewrite_swaps_old_spellings_only_where_they_were_options(argv: list[str], expect: list[str]) -> None:
    new, notes, refusal = rewrite(argv)
    assert new == expect and refusal is None
    assert len(notes) == sum(a != b for a, b in zip(argv, expect, strict=True))


@pytest.mark.parametrize(
    ("argv", "new", "then"),
    [
        (("bench", "decode", "http://127.0.0.1:9", "--tokens", "1"), "--output-len",
         "--output-len must be at least 2"),
        (("ab", "examples/gemma-llamacpp", "--variants", "base,fast", "--tokens", "1"), "--output-len",
         "--output-len must be at least 2"),
        (("bench", "serve", "http://127.0.0.1:9", "--requests", "0"), "--num-prompts",
         "--num-prompts must be at least 1"),
        (("bench", "serve", "http://127.0.0.1:9", "--slo", "latency=1s"), "--goodput", "bad --goodput"),
        (("bench", "serve", "http://127.0.0.1:9", "--dataset", "nope"), "--dataset-name",
         "unknown --dataset-name 'nope'"),
        (("bench", "serve", "http://127.0.0.1:9", "--dataset", "missing.jsonl"), "--dataset-path",
         "--dataset-path missing.jsonl: no such file"),
        (("bench", "prefill", "http://127.0.0.1:9", "--lengths", "0"), "--input-len", "bad prompt length '0'"),
        (("eval", "needle", "http://127.0.0.1:9", "--lengths", "0"), "--input-len", "bad length '0'"),
        (("bench", "export", "last", "--output", "x.json"), "--out", "no bench run"),
        (("init", "h", "h", "--output", "c.toml"), "--out", "a host is given twice"),
    ],
    ids=["decode-tokens", "ab-tokens", "serve-requests", "serve-slo", "serve-dataset", "serve-dataset-file",
         "prefill-lengths", "needle-lengths", "export-output", "init-output"],
)  # fmt: skip
def test_an_old_spelling_still_works_with_one_deprecation_line(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], new: str, then: str
) -> None:
    # Each reaches the check that reads the value: the old option was carried to the new one.
    code, out, err = run_main(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 2, err
    old = next(a for a in argv if a.startswith("--") and a in {o for r in RENAMED.values() for o in r})
    assert lines[0].startswith("warning: ") and f"{old} is deprecated, use {new}" in lines[0]
    assert lines[1].startswith("error: ") and then in lines[1], lines[1]


@pytest.mark.parametrize(
    "argv",
    [
        ("bench", "serve", "http://127.0.0.1:9", "--json", "run.json"),
        ("bench", "serve", "--json", "run.json", "http://127.0.0.1:9"),
        ("bench", "serve", "http://127.0.0.1:9", "--json=run.json"),
        ("eval", "quality", "http://127.0.0.1:9", "--json", "run.json"),
        ("eval", "needle", "http://127.0.0.1:9", "--json", "run.json"),
        ("ab", "examples/gemma-llamacpp", "--variants", "base,fast", "--json", "run.json"),
    ],
)
def test_json_with_a_file_is_refused_naming_out(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    # --json took a file in these commands; it now means something else, so the old form is an error.
    code, out, err = run_main(capsys, *argv)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"error: sparkfleet {' '.join(argv[: 1 if argv[0] == 'ab' else 2])}: --json no longer takes a file: it "
        "prints the result as JSON on stdout; write the file with --out run.json"
    ]


def test_an_old_per_format_file_option_keeps_its_format_or_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "ab", "examples/gemma-llamacpp", "--variants", "base,fast", "--md", "r.txt")
    assert code == 2 and err.strip() == (
        "error: sparkfleet ab: --md r.txt: files are written with --out now, the format following the suffix: "
        "--out FILE.md"
    )


def test_bench_json_is_the_run_alone_on_stdout_and_out_writes_the_same(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with ReplayServer(Script(base_ttft=0.005, itl=0.002)).running() as server:
        code, out, err = run_main(capsys, "bench", "serve", server.url, "--request-rate", "inf", "--num-prompts", "4",
                                  "--discard-runs", "0", "--output-len", "4", "--api", "completions", "--json",
                                  "--out", str(tmp_path / "run.json"), "--out", str(tmp_path / "run.md"))  # fmt: skip
        assert code == 0, err
        printed = json.loads(out)  # stdout is the JSON document and nothing else
        assert printed["run"]["kind"] == "serve" and printed == json.loads((tmp_path / "run.json").read_text())
        assert "| inf/s |" in (tmp_path / "run.md").read_text()
        code, out, err = run_main(capsys, "bench", "decode", server.url, "--concurrency", "1", "--types", "prose",
                                  "--output-len", "4", "--repeats", "1", "--warmups", "0", "--api", "completions",
                                  "--json")  # fmt: skip
        assert code == 0, err
        assert json.loads(out)["run"]["kind"] == "decode"


def test_out_with_an_unknown_suffix_is_refused_before_any_request(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "bench", "decode", "http://127.0.0.1:9", "--model", "m", "--out", "run.txt")
    assert code == 2 and "--out run.txt: give a .json, .csv, .md or .png file" in err


@pytest.mark.parametrize(
    "argv",
    [
        ("plan", "examples/gemma-llamacpp", "--json"),
        ("stage", "examples/gemma-llamacpp", "--json"),  # nothing to stage: [] on stdout, the words on stderr
        ("status", "--json"),
        ("gateway", "key", "list", "--json"),
        ("gateway", "log", "--json"),
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_json_commands_print_json_alone_on_stdout(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    code, out, err = run_main(capsys, *argv)
    assert code == 0, err
    json.loads(out)
