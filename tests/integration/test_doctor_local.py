"""`sparkfleet doctor --json` on this machine (the default `local` cluster, no SSH)."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys

import pytest

from sparkfleet.doctor.run import DoctorSpec, NodeTarget, run_doctor
from sparkfleet.nodes.transport.local import LocalTransport
from sparkfleet.plan.memory import GIB, MemoryInputs, plan_memory

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


def test_memory_plans_come_back_with_the_report() -> None:
    def memory(target, facts):  # type: ignore[no-untyped-def]
        total = facts[target.name].meminfo.total  # this machine's RAM as "unified memory"
        return plan_memory(MemoryInputs(
            engine="sglang", argv=("x", "--mem-fraction-static", "0.5"), env=(), rank=0, tp=1, nnodes=1,
            device_memory=total, device_source="MemTotal", weights_per_rank=GIB, kv_bytes_per_token=1000.0,
            cuda_graph=0))  # fmt: skip

    spec = DoctorSpec(nodes=(NodeTarget(name="local", fabric_ip="127.0.0.1", head=True),))
    report = run_doctor(spec, {"local": LocalTransport("local")}, memory)
    data = json.loads(json.dumps(report.to_json()))
    assert data["memory"]["local"]["fraction"] == 0.5
    assert {c["id"] for c in data["checks"]} >= {"mem.plan", "mem.available"}
