"""The perftest stand-in (tests/fleet/perftest_standin.py) against the real tool: every flag it
accepts, and every flag doctor passes, is one real perftest's `--help` lists (Debian's perftest;
skipped where it is not installed), and a flag outside that set is refused as perftest refuses it."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from sparkfleet.nodes.linktest import perftest_argv
from tests.fleet import perftest_standin

TOOLS = ("ib_write_bw", "ib_write_lat")


def _help(tool: str) -> str:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed (Debian: apt-get install perftest)")
    proc = subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=10)
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("tool", TOOLS)
def test_every_flag_the_standin_accepts_is_in_real_perftest_help(tool: str) -> None:
    text = _help(tool)
    for names in perftest_standin.accepted(tool):
        short = names[0] if len(names) == 2 else None
        long = names[-1]
        listed = re.search(rf"^\s+{re.escape(short)}, {re.escape(long)}\b" if short else rf"^\s+{re.escape(long)}\b",
                           text, re.MULTILINE)  # fmt: skip
        assert listed, f"{tool} --help does not list {names}"


@pytest.mark.parametrize("tool", TOOLS)
def test_the_argv_doctor_passes_is_accepted_by_both(tool: str) -> None:
    argv = perftest_argv(tool, "rocep1s0f0", 3, 18515)[1:]
    args = perftest_standin.parser(tool).parse_args([*argv, "192.168.200.12"])
    assert (args.ib_dev, args.gid_index, args.port, args.host) == ("rocep1s0f0", "3", "18515", "192.168.200.12")
    text = _help(tool)
    for flag in (a for a in argv if a.startswith("-")):
        assert re.search(rf"(^|\s){re.escape(flag)}(,|=|\s)", text, re.MULTILINE), f"{tool} --help lists no {flag}"


def test_a_flag_perftest_does_not_list_is_refused() -> None:
    with pytest.raises(SystemExit):
        perftest_standin.parser().parse_args(["--bogus"])
    with pytest.raises(SystemExit):  # real ib_write_lat: "Multiple QPs only available on bw tests"
        perftest_standin.parser("ib_write_lat").parse_args(["-q", "4"])
    assert perftest_standin.main(["--bogus"]) == 1
