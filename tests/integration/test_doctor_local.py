"""`sparkfleet doctor --json` on this machine (the default `local` cluster, no SSH)."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_local_doctor_reports_this_machine() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sparkfleet.cli.main", "doctor", "--json"], capture_output=True, text=True, timeout=120
    )
    report = json.loads(proc.stdout)
    by_id = {c["id"]: c for c in report["checks"]}
    assert proc.returncode == (1 if report["counts"]["fail"] else 0)
    assert by_id["ssh.reachable"]["status"] == "pass"
    assert by_id["ssh.reachable"]["evidence"].startswith(f"user {getpass.getuser()},")
    assert by_id["mem.available"]["evidence"].startswith("MemAvailable ")
    assert by_id["clock.skew"]["status"] == "pass"
    assert {c["node"] for c in report["checks"]} == {"local"}
