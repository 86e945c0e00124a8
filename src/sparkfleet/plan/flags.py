"""The one reader of engine command-line flags: ``--x=y`` and ``--x y`` alike, ``_`` and ``-``
the same (``--max_model_len`` is ``--max-model-len``: the engines' argparse accepts both), and
the last occurrence wins, as argparse does. Words like ``-1`` or ``0.5`` are values, not flags.

Everything that reads a flag out of ``args`` or a planned argv uses it: the served model name,
the per-rank flags a recipe may not set, the memory model, the importers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def is_number(word: str) -> bool:
    """True for words like ``-1`` or ``0.5`` that look like flags but are values."""
    try:
        float(word)
    except ValueError:
        return False
    return True


def is_flag(word: str) -> bool:
    """True for an option word (``-a``, ``--x``, ``--x=y``), false for values (``-1``, ``foo``)."""
    return word.startswith("-") and len(word) > 1 and not is_number(word)


def normal(flag: str) -> str:
    """A flag name with ``_`` read as ``-`` (how it is compared)."""
    return flag.replace("_", "-")


def flag_name(word: str) -> str:
    """The option name of a flag word: ``--a=b`` is ``--a``."""
    return word.split("=", 1)[0]


def flag_names(args: Sequence[str]) -> set[str]:
    """The option names in an argument list, as written (``--a=b`` counts as ``--a``)."""
    return {flag_name(a) for a in args if is_flag(a)}


def _matches(word: str, wanted: set[str]) -> bool:
    return is_flag(word) and normal(flag_name(word)) in wanted


def has_flag(args: Sequence[str], *names: str) -> bool:
    """True when any of names appears in args, alone or as ``--name=value``."""
    wanted = {normal(n) for n in names}
    return any(_matches(a, wanted) for a in args)


def flag_value(args: Sequence[str], *names: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` for any of names (aliases of one option); the
    last occurrence wins. None when the flag is absent or has no value after it."""
    wanted = {normal(n) for n in names}
    value = None
    for i, word in enumerate(args):
        if not _matches(word, wanted):
            continue
        _, eq, inline = word.partition("=")
        if eq:
            value = inline
        elif i + 1 < len(args):
            value = args[i + 1]
    return value


def first_present(args: Sequence[str], names: Iterable[str]) -> str | None:
    """The first flag of args, as written and in sorted order, that is one of names; or None."""
    wanted = {normal(n) for n in names}
    for flag in sorted(flag_names(args)):
        if normal(flag) in wanted:
            return flag
    return None


def flag_groups(args: Sequence[str]) -> list[list[str]]:
    """args split into option groups: each flag word with the values that follow it, up to the
    next flag. Words before the first flag (a subcommand like ``serve``) form a group of their own.
    This is how a flag is added, removed or replaced by name while its values travel with it."""
    groups: list[list[str]] = []
    for word in args:
        if is_flag(word) or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


def group_flag(group: Sequence[str]) -> str | None:
    """The normal option name a group from flag_groups starts with (None for leading words)."""
    return normal(flag_name(group[0])) if group and is_flag(group[0]) else None


def without(args: Sequence[str], names: Iterable[str]) -> list[str]:
    """args without any of the flags names, each with the values that follow it."""
    wanted = {normal(n) for n in names}
    return [w for g in flag_groups(args) if group_flag(g) not in wanted for w in g]
