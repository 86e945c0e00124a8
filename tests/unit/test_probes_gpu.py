"""nvidia-smi parsing, on the H200 capture (and the GB10 unified-memory shape of the same query)."""

from __future__ import annotations

from sparkfleet.doctor.probes import gpu, meminfo
from sparkfleet.plan.memory import usable_memory
from tests.unit._captures import h200_section


def test_h200_query_gpu_line_gives_one_gpu_with_its_memory() -> None:
    gpus = gpu.parse_gpus(h200_section("query-gpu csv", "nvidia-smi-h200.txt"))
    assert len(gpus) == 1
    g = gpus[0]
    assert (g.index, g.name, g.driver, g.compute_cap) == (0, "NVIDIA H200", "580.159.04", "9.0")
    assert (g.memory_total_mib, g.memory_used_mib, g.memory_free_mib) == (143771, 0, 143156)
    assert g.uuid == "GPU-15eaac1e-c3ac-f04d-57f3-9ac0dc3bb406"
    assert not g.unified_memory


def test_h200_compute_apps_header_only_means_no_process_holds_memory() -> None:
    facts = gpu.parse(
        h200_section("query-gpu csv", "nvidia-smi-h200.txt"),
        0,
        h200_section("query-compute-apps", "nvidia-smi-h200.txt"),
    )
    assert facts.available and facts.count == 1
    assert facts.processes == ()


def test_compute_apps_rows_with_units_are_read() -> None:
    # Same header as the H200 capture, with rows as nvidia-smi prints them under load.
    text = "pid, process_name, used_gpu_memory [MiB]\n4242, python3, 70000 MiB\n77, /usr/bin/x, [N/A]\n"
    procs = gpu.parse_apps(text)
    assert [(p.pid, p.name, p.used_mib) for p in procs] == [
        (4242, "python3", 70000),
        (77, "/usr/bin/x", None),
    ]


def test_unified_memory_gpu_falls_back_to_memavailable() -> None:
    # DGX Spark (GB10): NVML reports no framebuffer, the memory columns read [N/A] (public
    # reports; the line is the captured H200 one with those columns as GB10 prints them).
    line = h200_section("query-gpu csv", "nvidia-smi-h200.txt").strip().split(", ")
    line[1], line[3:6] = "NVIDIA GB10", ["[N/A]", "[N/A]", "[N/A]"]
    facts = gpu.parse(", ".join(line) + "\n", 0, "")
    assert facts.gpus[0].unified_memory
    mem = meminfo.parse(h200_section("meminfo"))
    assert usable_memory(facts, mem)[0] == mem.available == 131470044 * 1024


def test_discrete_gpu_uses_its_framebuffer() -> None:
    facts = gpu.parse(h200_section("query-gpu csv", "nvidia-smi-h200.txt"), 0, "")
    assert usable_memory(facts, None)[0] == 143771 * 1024 * 1024


def test_missing_nvidia_smi_is_reported_not_raised() -> None:
    facts = gpu.parse("", 127, "", "sh: 1: nvidia-smi: not found\n")
    assert not facts.available and facts.error == "nvidia-smi not found"
