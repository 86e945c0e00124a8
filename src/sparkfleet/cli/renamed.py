"""Options that were renamed so that one concept has one spelling in every command (issue 36).

The spellings follow ``vllm bench serve`` where it has one (``--output-len``, ``--input-len``,
``--num-prompts``, ``--goodput``, ``--dataset-name``/``--dataset-path``); a file a command
writes is ``--out``/``-o`` everywhere; ``--json`` is a flag everywhere and prints the result as
JSON on stdout. An old spelling keeps working: ``rewrite`` swaps it for the new one before the
command line is parsed and says so in one line on stderr. ``--json FILE``, whose meaning
changed, is refused by ``explain`` with a line naming ``--out``.

Standard library only: this runs before every command, ``--help`` included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# An old option → the new one; a callable picks the new option from the value (None: refuse,
# with the message it returns in second place).
Rule = str | Callable[[str], tuple[str | None, str]]


def _dataset(value: str) -> tuple[str | None, str]:
    """``--dataset random|prefix|multiturn`` named the dataset; ``--dataset FILE.jsonl`` a file."""
    return ("--dataset-path" if value.endswith((".jsonl", ".json")) else "--dataset-name"), ""


def _suffix(suffix: str, old: str) -> Callable[[str], tuple[str | None, str]]:
    """An old per-format file option (``--md FILE``): ``--out FILE`` when FILE has the suffix
    that makes ``--out`` write that format, else a refusal naming the suffix."""

    def rule(value: str) -> tuple[str | None, str]:
        if value.lower().endswith(suffix):
            return "--out", ""
        return None, (
            f"{old} {value}: files are written with --out now, the format following the suffix: --out FILE{suffix}"
        )

    return rule


RENAMED: dict[tuple[str, ...], dict[str, Rule]] = {
    ("bench", "decode"): {"--tokens": "--output-len"},
    ("bench", "prefill"): {"--lengths": "--input-len"},
    ("bench", "serve"): {"--requests": "--num-prompts", "--slo": "--goodput", "--dataset": _dataset},
    ("bench", "export"): {"--output": "--out"},
    ("ab",): {"--tokens": "--output-len", "--lengths": "--input-len", "--md": _suffix(".md", "--md")},
    ("eval", "needle"): {"--lengths": "--input-len", "--png": _suffix(".png", "--png")},
    ("init",): {"--output": "--out"},
}
# Commands whose --json took a file before it became the flag that prints JSON on stdout.
JSON_WAS_A_FILE = {("bench", "serve"), ("ab",), ("eval", "quality"), ("eval", "needle")}


def command_of(argv: Sequence[str]) -> tuple[str, ...]:
    """The command path that argv names and the tables know (``("bench", "decode")``), or ()."""
    for path in (*RENAMED, *JSON_WAS_A_FILE):
        if tuple(argv[: len(path)]) == path:
            return path
    return ()


def rewrite(argv: Sequence[str]) -> tuple[list[str], list[str], str | None]:
    """argv with every old spelling replaced by the new one; a deprecation line for each; and
    the refusal, when an old spelling cannot be carried over."""
    path = command_of(argv)
    rules = RENAMED.get(path, {})
    out = list(argv[: len(path)])
    notes: list[str] = []
    rest = list(argv[len(path) :])
    for i, word in enumerate(rest):
        if word == "--":
            out += rest[i:]
            break
        name, eq, inline = word.partition("=")
        rule = rules.get(name)
        if rule is None:
            out.append(word)
            continue
        value = inline if eq else (rest[i + 1] if i + 1 < len(rest) else "")
        new, refusal = rule(value) if callable(rule) else (rule, "")
        where = f"sparkfleet {' '.join(path)}"
        if new is None:
            return list(argv), notes, f"{where}: {refusal}"
        notes.append(f"{where}: {name} is deprecated, use {new} (the old spelling will go)")
        out.append(f"{new}={inline}" if eq else new)
    return out, notes, None


def explain(argv: Sequence[str], message: str) -> str | None:
    """A line naming ``--out`` when a usage error comes from ``--json FILE`` (or ``--json=FILE``)
    in a command whose --json took a file; None for any other error."""
    path = command_of(argv)
    if path not in JSON_WAS_A_FILE:
        return None
    words = list(argv)
    for i, word in enumerate(words):
        if word.startswith("--json=") and "does not take a value" in message:
            return _json_line(path, word.partition("=")[2])
        if word == "--json" and "extra argument" in message and i + 1 < len(words) and not words[i + 1].startswith("-"):
            # The old form leaves one positional too many: click names it as an extra argument.
            return _json_line(path, words[i + 1])
    return None


def _json_line(path: tuple[str, ...], file: str) -> str:
    return (f"sparkfleet {' '.join(path)}: --json no longer takes a file: it prints the result as JSON on stdout; "
            f"write the file with --out {file}")  # fmt: skip
