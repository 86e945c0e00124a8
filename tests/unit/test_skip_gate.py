"""tests/skip_gate.py: a test that did not run fails a CI run unless the reviewed allowlist names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.skip_gate import DEFAULT_ALLOWLIST, matches, read_allowlist

SUITE = """
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason="this kernel has no nfsd")
def test_nfs():
    pass

def test_engine_missing():
    pytest.skip("the llama.cpp venv missing")

@pytest.mark.xfail(reason="known engine bug")
def test_expected_to_fail():
    assert False

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    pytest.skip(f"needs {n} GPUs")
"""

ALL_NOT_RUN = (
    "test_suite.py::test_nfs | this kernel has no nfsd (CONFIG_NFSD unset)\n"
    "test_suite.py::test_engine_missing | no engine on this machine\n"
    "test_suite.py::test_expected_to_fail | engine bug #12, fixed upstream in 1.2\n"
    "test_suite.py::test_param | no GPUs here\n"
)


def _run(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    ci: str | None,
    allow: str | None,
    suite: str = SUITE,
    *extra: str,
) -> pytest.RunResult:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makepyfile(test_suite=suite)
    allowlist = pytester.path / "allow.txt"
    allowlist.write_text("# reviewed\n\n" + (allow or ""))
    # Without the hypothesis and anyio plugins an inner run takes milliseconds, not a second.
    quick = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:anyio"]
    pytester.makeini("[pytest]\nskip_gate_may_disable = cacheprovider hypothesispytest anyio\n")
    return pytester.runpytest("-p", "tests.skip_gate", "--skip-allowlist", str(allowlist), *quick, *extra)


def test_outside_ci_skips_are_listed_and_the_run_passes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(pytester, monkeypatch, None, None)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "*tests that did not run: 5, not allowlisted: 5 (not CI: listed only)*",
            "NOT ALLOWLISTED SKIPPED test_suite.py::test_engine_missing: the llama.cpp venv missing",
            "NOT ALLOWLISTED XFAILED test_suite.py::test_expected_to_fail: known engine bug",
            "NOT ALLOWLISTED SKIPPED test_suite.py::test_nfs: this kernel has no nfsd",
            "NOT ALLOWLISTED SKIPPED test_suite.py::test_param[[]1[]]: needs 1 GPUs",
            "NOT ALLOWLISTED SKIPPED test_suite.py::test_param[[]2[]]: needs 2 GPUs",
        ]
    )


@pytest.mark.parametrize("ci", ["true", "1", "TRUE"])
def test_under_ci_a_skip_not_allowlisted_fails_the_run(
    ci: str, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    allow = "test_suite.py::test_nfs | this kernel has no nfsd (CONFIG_NFSD unset)\n"
    result = _run(pytester, monkeypatch, ci, allow)
    result.assert_outcomes(passed=1, skipped=4, xfailed=1)  # every test that ran passed...
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # ...and the run still fails
    result.stdout.fnmatch_lines(
        [
            "*tests that did not run: 5, not allowlisted: 4 (CI=true: not allowlisted fails the run)*",
            "allowlisted     SKIPPED test_suite.py::test_nfs: this kernel has no nfsd (allow.txt:3)",
            "skip gate: 4 test(s) did not run and are not in *allow.txt*",
        ]
    )


def test_under_ci_every_skip_allowlisted_passes(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, "true", ALL_NOT_RUN)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*tests that did not run: 5, not allowlisted: 0 (CI=true*"])
    result.stdout.no_fnmatch_line("*NOT ALLOWLISTED*")


def test_under_ci_a_run_with_no_skips_passes(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, "true", None, suite="def test_ok():\n    pass\n")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["skip gate: every collected test ran (CI=true*"])


def test_ci_false_only_lists(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(pytester, monkeypatch, "false", None).ret == pytest.ExitCode.OK


def test_importorskip_and_module_skips_are_skips_too(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_gone='import pytest\npytest.importorskip("no_such_module_sparkfleet")\n\ndef test_a():\n    pass\n'
    )
    suite = 'import pytest\n\ndef test_b():\n    pytest.importorskip("no_such_module_sparkfleet_either")\n'
    result = _run(pytester, monkeypatch, "true", None, suite=suite)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines_random(
        [
            "NOT ALLOWLISTED SKIPPED test_gone.py: *no_such_module_sparkfleet*",
            "NOT ALLOWLISTED SKIPPED test_suite.py::test_b: *no_such_module_sparkfleet_either*",
        ]
    )
    # A module prefix in the allowlist covers the module's collection skip.
    allow = "test_gone.py | no such module here\ntest_suite.py::test_b | nor this one\n"
    assert _run(pytester, monkeypatch, "true", allow, suite=suite).ret == pytest.ExitCode.OK


def test_an_xfail_that_passes_is_listed(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = 'import pytest\n\n@pytest.mark.xfail(reason="flaky upstream")\ndef test_x():\n    pass\n'
    result = _run(pytester, monkeypatch, "true", None, suite=suite)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["NOT ALLOWLISTED XPASSED test_suite.py::test_x: flaky upstream"])


def test_failures_keep_their_exit_status(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = "import pytest\n\ndef test_f():\n    assert False\n\ndef test_s():\n    pytest.skip('x')\n"
    assert _run(pytester, monkeypatch, "true", None, suite=suite).ret == pytest.ExitCode.TESTS_FAILED
    result = _run(
        pytester, monkeypatch, "true", None, suite="import pytest\npytest.skip('x', allow_module_level=True)\n"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # nothing ran at all: still a failure


def test_an_entry_without_a_reason_is_refused(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, "true", "test_suite.py::test_nfs\n")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*allow.txt:3: want '<test id or prefix> | <machine reason>'*"])


def test_prefixes_match_at_boundaries() -> None:
    assert matches("tests/integration/test_x.py", "tests/integration/test_x.py::test_y")
    assert matches("tests/integration/", "tests/integration/test_x.py::test_y")
    assert matches("tests/integration", "tests/integration/test_x.py::test_y")
    assert matches("tests/a.py::test_y", "tests/a.py::test_y[1-2]")
    assert matches("tests/a.py::TestC", "tests/a.py::TestC::test_y")
    assert not matches("tests/a.py::test_y", "tests/a.py::test_yz")
    assert not matches("tests/a", "tests/ab.py::test_y")
    assert not matches("tests/a.py::test_y[1]", "tests/a.py::test_y[2]")


def test_the_project_allowlist_is_well_formed_and_every_entry_names_a_real_test() -> None:
    root = DEFAULT_ALLOWLIST.parents[1]
    for entry in read_allowlist(DEFAULT_ALLOWLIST):
        path, _, name = entry.pattern.partition("::")
        assert (root / path).exists(), f"skip-allowlist.txt:{entry.line}: {path} does not exist"
        if name:
            func = name.split("[")[0].split("::")[-1]
            assert f"def {func}(" in (root / path).read_text(), f"skip-allowlist.txt:{entry.line}: no {func} in {path}"
        assert len(entry.reason) >= 20, f"skip-allowlist.txt:{entry.line}: say what on this machine prevents it"


def test_the_default_allowlist_is_the_one_file() -> None:
    assert Path(__file__).resolve().parents[1] / "skip-allowlist.txt" == DEFAULT_ALLOWLIST
    assert DEFAULT_ALLOWLIST.is_file(), "the one reviewed allowlist is missing"


PLAIN = "import pytest\n\n@pytest.mark.e2e\ndef test_engine():\n    pass\n\ndef test_unit():\n    pass\n"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("-m", "not e2e"), "-m 'not e2e' selects by mark"),
        (("-k", "unit"), "-k 'unit' selects by name"),
        (("test_suite.py::test_unit",), "path arguments 'test_suite.py::test_unit' replace the configured testpaths"),
        (("-p", "no:doctest"), "-p no:doctest disables a plugin"),
        (("--ignore", "other"), "--ignore 'other' skips collecting paths"),
    ],
)
def test_under_ci_a_narrowed_run_is_refused_before_it_runs(
    args: tuple[str, ...], named: str, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(pytester, monkeypatch, "true", None, PLAIN, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*skip gate: under CI=true the run was narrowed: {named}*"])
    result.stdout.no_fnmatch_line("*passed*")  # nothing ran
    # The same options outside CI are a developer's everyday run: it passes.
    assert _run(pytester, monkeypatch, None, None, PLAIN, *args).ret == pytest.ExitCode.OK


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--deselect", "test_suite.py::test_engine"), "1 collected test(s) were deselected"),
        (("-x", "--collect-only"), "2 collected test(s) never ran"),
    ],
)
def test_under_ci_tests_deselected_or_never_run_fail_the_run(
    args: tuple[str, ...], named: str, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(pytester, monkeypatch, "true", None, PLAIN, *args)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"skip gate: the run was narrowed: {named}*"])
    assert _run(pytester, monkeypatch, None, None, PLAIN, *args).ret == pytest.ExitCode.OK


def test_under_ci_pytest_addopts_narrows_the_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_ADDOPTS", "-k unit")
    result = _run(pytester, monkeypatch, "true", None, PLAIN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*narrowed: -k 'unit' selects by name; PYTEST_ADDOPTS='-k unit' adds options*"])


def test_under_ci_the_whole_configured_run_passes(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, "true", None, PLAIN)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.no_fnmatch_line("*narrowed*")
