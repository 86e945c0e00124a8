"""CI cannot hide: every test that did not run is listed, and under ``CI=true`` each must be allowlisted.

A skip (``pytest.skip``, ``skipif``, ``importorskip``, a module skipped while collecting) and an
expected failure (``xfail``, and an ``xfail`` that passed) are all tests whose result nobody saw.
At the end of every run this plugin prints them with their reasons and whether the allowlist
covers them. Under ``CI=true`` (or ``1``/``yes``) a run with any such test that the allowlist
does not cover exits non-zero, even when every test that ran passed.

The allowlist is one reviewed file, ``tests/skip-allowlist.txt`` (``--skip-allowlist PATH``
overrides it). One entry per line::

    <test id or id prefix> | <why this machine cannot run it>

A prefix matches at a boundary: ``tests/integration/test_x.py`` covers every test in that
module, ``tests/integration/test_x.py::test_y`` covers ``test_y`` and its parametrizations,
``test_y`` never covers ``test_yz``. Blank lines and ``#`` comments are ignored; an entry without
a reason is an error. Loaded from tests/conftest.py; tests/unit/test_skip_gate.py tests it.

A run can also hide tests by never collecting or never running them. Under ``CI=true`` the gate
refuses a run that was narrowed, before anything runs where the options say so: ``-m``, ``-k``,
path arguments instead of the configured ``testpaths``, ``--ignore``, ``-o``/``--override-ini``,
``PYTEST_ADDOPTS``, a plugin disabled with ``-p no:NAME`` other than those the ini option
``skip_gate_may_disable`` names. Tests deselected while collecting (``--deselect``, ``--lf``) and
collected tests that never ran (``-x``, ``--maxfail``, ``--co``) fail the run at its end.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DEFAULT_ALLOWLIST = Path(__file__).resolve().parent / "skip-allowlist.txt"
SEPARATOR = " | "


@dataclass(frozen=True)
class Entry:
    pattern: str
    reason: str
    line: int


@dataclass(frozen=True)
class NotRun:
    nodeid: str
    kind: str  # skipped | xfailed | xpassed
    reason: str


def ci_enabled(env: dict[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get("CI", "")
    return value.strip().lower() in ("true", "1", "yes")


def matches(pattern: str, nodeid: str) -> bool:
    """The pattern is the id, or a prefix of it that ends at a path/name/parameter boundary."""
    if nodeid == pattern:
        return True
    if not nodeid.startswith(pattern):
        return False
    return pattern[-1] in "/:[" or nodeid[len(pattern)] in "/:["


def read_allowlist(path: Path) -> list[Entry]:
    """Entries of the allowlist; a missing file is an empty list."""
    if not path.is_file():
        return []
    entries = []
    for n, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pattern, sep, reason = line.partition(SEPARATOR)
        if not sep or not pattern.strip() or not reason.strip():
            raise pytest.UsageError(f"{path}:{n}: want '<test id or prefix>{SEPARATOR}<machine reason>', got {raw!r}")
        entries.append(Entry(pattern.strip(), reason.strip(), n))
    return entries


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--skip-allowlist",
        default=str(DEFAULT_ALLOWLIST),
        help="the reviewed list of tests allowed not to run under CI=true (default: tests/skip-allowlist.txt)",
    )
    parser.addini(
        "skip_gate_may_disable",
        type="args",
        default=[],
        help="plugins that -p no:NAME may disable under CI=true without narrowing the run",
    )


def pytest_configure(config: pytest.Config) -> None:
    path = Path(config.getoption("--skip-allowlist"))
    if path != DEFAULT_ALLOWLIST and not path.is_file():
        raise pytest.UsageError(f"--skip-allowlist {path}: no such file")
    narrowed = narrowing(config, os.environ)
    if narrowed and ci_enabled():  # before anything runs: a narrowed CI run is refused at once
        raise pytest.UsageError("skip gate: under CI=true the run was narrowed: " + "; ".join(narrowed))
    config.pluginmanager.register(Gate(path, read_allowlist(path), ci_enabled()), "sparkfleet-skip-gate")


def narrowing(config: pytest.Config, env: Mapping[str, str]) -> list[str]:
    """How this run's options keep configured tests from being collected: one reason each."""
    option = config.option
    reasons = []
    if getattr(option, "keyword", ""):
        reasons.append(f"-k {option.keyword!r} selects by name")
    if getattr(option, "markexpr", ""):
        reasons.append(f"-m {option.markexpr!r} selects by mark")
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        reasons.append(f"path arguments {' '.join(config.args)!r} replace the configured testpaths")
    for name in ("ignore", "ignore_glob"):
        if getattr(option, name, None):
            reasons.append(f"--{name.replace('_', '-')} {' '.join(getattr(option, name))!r} skips collecting paths")
    if getattr(option, "override_ini", None):
        reasons.append(f"-o {' '.join(option.override_ini)!r} overrides the configuration")
    if env.get("PYTEST_ADDOPTS", "").strip():
        reasons.append(f"PYTEST_ADDOPTS={env['PYTEST_ADDOPTS']!r} adds options")
    may = set(config.getini("skip_gate_may_disable"))
    for plugin in getattr(option, "plugins", None) or []:
        if plugin.startswith("no:") and plugin[3:] not in may:
            reasons.append(f"-p {plugin} disables a plugin")
    if env.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "").strip():
        reasons.append("PYTEST_DISABLE_PLUGIN_AUTOLOAD disables installed plugins")
    return reasons


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    if getattr(report, "wasxfail", None) is not None:
        return str(report.wasxfail) or "xfail"
    longrepr = report.longrepr
    text = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ").strip() or "(no reason given)"


@dataclass(eq=False)  # a plugin must be hashable
class Gate:
    """The plugin: collects what did not run, prints it, and sets the exit status under CI."""

    allowlist: Path
    entries: list[Entry]
    ci: bool
    seen: dict[str, NotRun] = field(default_factory=dict)
    deselected: int = 0
    collected: set[str] = field(default_factory=set)
    executed: set[str] = field(default_factory=set)

    def covering(self, nodeid: str) -> Entry | None:
        return next((e for e in self.entries if matches(e.pattern, nodeid)), None)

    def unallowed(self) -> list[NotRun]:
        return [n for n in self.seen.values() if self.covering(n.nodeid) is None]

    def _note(self, nodeid: str, kind: str, report: pytest.TestReport | pytest.CollectReport) -> None:
        self.seen.setdefault(nodeid, NotRun(nodeid, kind, _reason(report)))

    def problems(self) -> list[str]:
        """Why this run did not run every configured test, apart from skips."""
        found = []
        if self.deselected:
            found.append(f"{self.deselected} collected test(s) were deselected")
        never = self.collected - self.executed
        if never:
            found.append(f"{len(never)} collected test(s) never ran (-x, --maxfail, --collect-only or an interrupt)")
        return found

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected += len(items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = {item.nodeid for item in session.items}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.executed.add(report.nodeid)
        if report.skipped:
            self._note(report.nodeid, "xfailed" if hasattr(report, "wasxfail") else "skipped", report)
        elif report.when == "call" and report.passed and hasattr(report, "wasxfail"):
            self._note(report.nodeid, "xpassed", report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:  # a module-level skip / importorskip: the whole module did not run
            self._note(report.nodeid or ".", "skipped", report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        passing = session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        if self.ci and passing and (self.unallowed() or self.problems()):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tr = terminalreporter
        mode = "CI=true: not allowlisted fails the run" if self.ci else "not CI: listed only"
        problems = self.problems() if self.ci else []
        for problem in problems:
            tr.write_line(f"skip gate: the run was narrowed: {problem}", red=True, bold=True)
        if not self.seen:
            if not problems:
                tr.write_line(f"skip gate: every collected test ran ({mode})")
            return
        bad = self.unallowed()
        tr.write_sep("=", f"tests that did not run: {len(self.seen)}, not allowlisted: {len(bad)} ({mode})")
        for n in sorted(self.seen.values(), key=lambda n: n.nodeid):
            entry = self.covering(n.nodeid)
            where = f" ({self.allowlist.name}:{entry.line})" if entry else ""
            tr.write_line(
                f"{'allowlisted' if entry else 'NOT ALLOWLISTED':<15} {n.kind.upper()} {n.nodeid}: {n.reason}{where}"
            )
        if bad and self.ci:
            tr.write_line(
                f"skip gate: {len(bad)} test(s) did not run and are not in {self.allowlist}: make them run on "
                f"this machine, or add '<test id>{SEPARATOR}<measured machine reason>' there for review",
                red=True,
                bold=True,
            )
