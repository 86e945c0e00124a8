"""The GPU probe on outputs captured on a real H200 while a process held 8 GiB (tests/fixtures/h200-device)."""

from __future__ import annotations

from pathlib import Path

from sparkfleet.doctor.probes import gpu

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "h200-device"


def test_the_probe_asks_exactly_the_fields_that_were_captured() -> None:
    assert gpu.GPU_COMMAND[1] == (
        "--query-gpu=index,name,uuid,memory.total,memory.used,memory.free,driver_version,pci.bus_id,"
        "compute_cap,clocks.max.sm"
    )


def test_idle_and_busy_h200_memory_and_the_process_holding_it() -> None:
    idle = gpu.parse((CAPTURES / "query-gpu-idle.csv").read_text(), 0, (CAPTURES / "compute-apps-idle.csv").read_text())
    busy = gpu.parse((CAPTURES / "query-gpu-busy.csv").read_text(), 0, (CAPTURES / "compute-apps-busy.csv").read_text())
    assert idle.processes == ()
    assert idle.gpus[0].memory_used_mib == 0 and idle.gpus[0].memory_free_mib == 143156
    assert busy.gpus[0].memory_used_mib == 8719 and busy.gpus[0].memory_free_mib == 134438
    assert [(p.pid, p.name, p.used_mib) for p in busy.processes] == [(422, "python3", 8710)]
    assert not busy.gpus[0].unified_memory
