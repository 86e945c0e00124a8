"""Reading a shell-style profile (``KEY=value`` lines a bash launcher sources with ``set -a``).

Only what such profiles use is understood: comments, ``export``, single and double quotes,
backslash escapes, ``$VAR`` / ``${VAR}`` / ``${VAR:-default}`` expansion from earlier lines.
Anything else (commands, ``$(...)``) is reported line by line, never guessed at. Reading is
pure: the control machine's environment is not consulted; ``$HOME`` becomes the value given
(by default sparkfleet's per-node ``{{home}}`` template, since the launcher sources the profile
on the node whose home it means).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkfleet.errors import RecipeError

_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A line the profile's author switched off: "#KEY=value", the hash right before the key. Prose
# that quotes an assignment is written "#   KEY=value" or "# … KEY=value" and is not one.
_COMMENTED = re.compile(r"^#(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*=.*)$", re.S)
_SECTION = re.compile(r"^#\s*─+\s*(.*?)\s*─*\s*$")


@dataclass(frozen=True)
class Assignment:
    """One ``KEY=value`` line, value already unquoted and expanded."""

    key: str
    value: str
    line: int


@dataclass(frozen=True)
class Skipped:
    """A line that is not a plain assignment, with the reason."""

    line: int
    text: str
    reason: str


@dataclass(frozen=True)
class OptionalBlock:
    """A run of commented-out assignments: one way of running the profile that its author left
    switched off (an image, a fabric, a line of adapter gates).

    ``section`` is the ``# ─── title ───`` it sits under; ``description`` the comment line right
    above it; ``follows`` the index of the section's first block when this one repeats a key of
    it (another line on top of the same image), else None (on top of the active profile)."""

    section: str
    description: str
    assignments: tuple[Assignment, ...]
    skipped: tuple[Skipped, ...]
    follows: int | None = None

    def values(self) -> dict[str, str]:
        return {a.key: a.value for a in self.assignments}


@dataclass(frozen=True)
class Profile:
    """The active assignments of a profile, in file order, and what could not be read."""

    source: str
    assignments: tuple[Assignment, ...]
    skipped: tuple[Skipped, ...]
    unresolved: tuple[str, ...]
    optional: tuple[OptionalBlock, ...] = ()

    def values(self) -> dict[str, str]:
        """Key → value; a key assigned twice keeps its last value, as in the shell."""
        return {a.key: a.value for a in self.assignments}


class _Unsupported(ValueError):
    pass


def _expand(text: str, i: int, env: dict[str, str], unresolved: list[str]) -> tuple[str, int]:
    """Expand the ``$`` expression at text[i]; return (value, index after it)."""
    nxt = text[i + 1 : i + 2]
    if nxt == "{":
        end = text.find("}", i + 2)
        if end < 0:
            raise _Unsupported("unterminated ${")
        inner = text[i + 2 : end]
        name, sep, default = inner.partition(":-")
        if not _NAME.fullmatch(name):
            raise _Unsupported(f"${{{inner}}} is not a plain variable expansion")
        if name in env and env[name] != "":
            return env[name], end + 1
        if not sep and name not in env:
            unresolved.append(name)
        return (default if sep else ""), end + 1
    if nxt == "(":
        raise _Unsupported("command substitution $(...) cannot be imported")
    m = _NAME.match(text, i + 1)
    if not m:
        return "$", i + 1
    name = m.group(0)
    if name not in env:
        unresolved.append(name)
    return env.get(name, ""), m.end()


def _value(text: str, env: dict[str, str], unresolved: list[str]) -> str:
    """Unquote and expand a shell word; trailing ``# comment`` is dropped, more words refused."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            rest = text[i:].strip()
            if rest and not rest.startswith("#"):
                raise _Unsupported(f"more than one word after '=' ({rest.split()[0]!r}...)")
            break
        if c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise _Unsupported("unterminated single quote")
            out.append(text[i + 1 : end])
            i = end + 1
        elif c == '"':
            i += 1
            while True:
                if i >= n:
                    raise _Unsupported("unterminated double quote")
                d = text[i]
                if d == '"':
                    i += 1
                    break
                if d == "\\" and i + 1 < n and text[i + 1] in '"\\$`\n':
                    out.append(text[i + 1] if text[i + 1] != "\n" else "")
                    i += 2
                elif d == "$":
                    value, i = _expand(text, i, env, unresolved)
                    out.append(value)
                elif d == "`":
                    raise _Unsupported("command substitution `...` cannot be imported")
                else:
                    out.append(d)
                    i += 1
        elif c == "\\":
            out.append(text[i + 1 : i + 2])
            i += 2
        elif c == "$":
            value, i = _expand(text, i, env, unresolved)
            out.append(value)
        elif c == "`":
            raise _Unsupported("command substitution `...` cannot be imported")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines joined where a quote stays open across a newline (multi-line values)."""
    result: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        pending.append(line)
        joined = "\n".join(pending)
        if _open_quote(joined):
            continue
        result.append((start, joined))
        pending = []
    if pending:
        result.append((start, "\n".join(pending)))
    return result


def _open_quote(text: str) -> bool:
    quote: str | None = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote is None:
            if c == "#" and (i == 0 or text[i - 1] in " \t"):
                return False
            if c in "'\"":
                quote = c
            elif c == "\\":
                i += 1
        elif c == quote:
            quote = None
        elif c == "\\" and quote == '"':
            i += 1
        i += 1
    return quote is not None


class _Blocks:
    """Collects OptionalBlocks while parse_profile walks the lines."""

    def __init__(self) -> None:
        self.done: list[OptionalBlock] = []
        self.section = ""
        self.section_first: int | None = None
        self.prose = ""
        self.open: list[Assignment] = []
        self.open_skipped: list[Skipped] = []
        self.open_description = ""

    def close(self) -> None:
        if not self.open:
            return
        follows = None
        if self.section_first is not None:
            first_keys = {a.key for a in self.done[self.section_first].assignments}
            follows = self.section_first if first_keys & {a.key for a in self.open} else None
        self.done.append(OptionalBlock(self.section, self.open_description, tuple(self.open),
                                       tuple(self.open_skipped), follows))  # fmt: skip
        if self.section_first is None:
            self.section_first = len(self.done) - 1
        self.open, self.open_skipped = [], []

    def line(self, number: int, stripped: str, env: dict[str, str]) -> None:
        section = _SECTION.match(stripped)
        if section:
            self.close()
            self.section, self.section_first, self.prose = section.group(1), None, ""
            return
        commented = _COMMENTED.match(stripped)
        if commented is None:
            text = stripped.lstrip("#").strip()
            if text:
                self.prose = text
            return
        key, raw = commented.group(1).split("=", 1)
        if any(a.key == key for a in self.open):
            self.close()  # the same key again: another alternative, not more of this one
        if not self.open:
            self.open_description = self.prose
        try:
            value = _value(raw, dict(env), [])
        except _Unsupported as exc:
            self.open_skipped.append(Skipped(number, stripped, str(exc)))
            return
        self.open.append(Assignment(key, value, number))


def parse_profile(text: str, source: str, home: str = "{{home}}") -> Profile:
    """Parse profile text; ``$HOME`` expands to ``home``."""
    env: dict[str, str] = {"HOME": home}
    assignments: list[Assignment] = []
    skipped: list[Skipped] = []
    unresolved: list[str] = []
    blocks = _Blocks()
    for number, line in _logical_lines(text):
        stripped = line.strip()
        if stripped.startswith("#"):
            blocks.line(number, stripped, env)
            continue
        if not stripped:
            continue
        m = _ASSIGN.match(stripped)
        if not m:
            skipped.append(Skipped(number, stripped, "not a KEY=value assignment"))
            continue
        key, raw = m.group(1), m.group(2)
        try:
            value = _value(raw, env, unresolved)
        except _Unsupported as exc:
            skipped.append(Skipped(number, stripped, str(exc)))
            continue
        env[key] = value
        assignments.append(Assignment(key, value, number))
    blocks.close()
    return Profile(source, tuple(assignments), tuple(skipped), tuple(dict.fromkeys(unresolved)), tuple(blocks.done))


def read_profile(path: str, home: str = "{{home}}") -> Profile:
    """Read and parse a profile file; an unreadable file is a RecipeError naming it."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: is not a UTF-8 text file") from None
    return parse_profile(text, path, home)
