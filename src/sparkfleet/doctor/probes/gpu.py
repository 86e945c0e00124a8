"""GPUs from `nvidia-smi --query-gpu` and `--query-compute-apps` (CSV).

On a DGX Spark (GB10, unified memory) NVML reports no framebuffer memory: the memory columns
read `[N/A]` or `[Not Supported]`. Then the usable memory is the OS `MemAvailable`
(`sparkfleet.plan.memory.usable_memory` takes it from the meminfo probe).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass

from sparkfleet.doctor.probes.bundle import ProbeOutput
from sparkfleet.doctor.probes.fact import Fact, section

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "memory.used",
    "memory.free",
    "driver_version",
    "pci.bus_id",
    "compute_cap",
    "clocks.max.sm",
)

GPU_COMMAND = ["nvidia-smi", f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]
APPS_COMMAND = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_gpu_memory", "--format=csv"]


@dataclass(frozen=True)
class Gpu:
    """One GPU; memory figures are None when NVML does not report them (unified memory)."""

    index: int
    name: str
    uuid: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    memory_free_mib: int | None
    driver: str
    bus_id: str
    compute_cap: str

    @property
    def unified_memory(self) -> bool:
        return self.memory_total_mib is None


@dataclass(frozen=True)
class GpuProcess:
    """A process already holding GPU memory (None: NVML does not say how much)."""

    pid: int
    name: str
    used_mib: int | None


@dataclass(frozen=True)
class GpuFacts:
    """What nvidia-smi says about a node; `available` is False where nvidia-smi is absent."""

    available: bool
    gpus: tuple[Gpu, ...]
    processes: tuple[GpuProcess, ...]
    error: str = ""

    @property
    def count(self) -> int:
        return len(self.gpus)


def _number(text: str) -> int | None:
    """'143771', '143771 MiB' -> int; '[N/A]', '[Not Supported]', 'N/A' -> None."""
    word = text.strip().split(" ")[0]
    try:
        return int(float(word))
    except ValueError:
        return None


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(text)) if row and any(row)]


def parse_gpus(stdout: str) -> tuple[Gpu, ...]:
    """Parse `GPU_COMMAND` output (no header, no units)."""
    gpus = []
    for row in _rows(stdout):
        if len(row) < 8:
            continue
        values = dict(zip(QUERY_FIELDS, row, strict=False))
        gpus.append(
            Gpu(
                index=int(values["index"]),
                name=values["name"],
                uuid=values["uuid"],
                memory_total_mib=_number(values["memory.total"]),
                memory_used_mib=_number(values["memory.used"]),
                memory_free_mib=_number(values["memory.free"]),
                driver=values["driver_version"],
                bus_id=values["pci.bus_id"],
                compute_cap=values.get("compute_cap", ""),
            )
        )
    return tuple(gpus)


def parse_apps(stdout: str) -> tuple[GpuProcess, ...]:
    """Parse `APPS_COMMAND` output (header line, values possibly with ' MiB')."""
    procs = []
    for row in _rows(stdout):
        if not row[0].isdigit() or len(row) < 3:
            continue  # the header, or "No running processes found"
        procs.append(GpuProcess(pid=int(row[0]), name=row[1], used_mib=_number(row[2])))
    return tuple(procs)


def parse(gpu_stdout: str, gpu_exit: int, apps_stdout: str = "", stderr: str = "") -> GpuFacts:
    """GpuFacts from both queries; a failed query is `available=False` with its error."""
    if gpu_exit != 0:
        reason = "nvidia-smi not found" if gpu_exit == 127 else (stderr.strip() or gpu_stdout.strip())
        last = reason.splitlines()[-1] if reason else ""
        return GpuFacts(available=False, gpus=(), processes=(), error=last)
    return GpuFacts(available=True, gpus=parse_gpus(gpu_stdout), processes=parse_apps(apps_stdout))


def _parse_both(outs: Mapping[str, ProbeOutput], _asked: object) -> GpuFacts:
    out = section(outs, "gpu")
    return parse(out.stdout, out.exit_code, outs["gpuapps"].stdout if "gpuapps" in outs else "", out.stderr)


FACT = Fact("gpu", lambda _req: {"gpu": GPU_COMMAND, "gpuapps": APPS_COMMAND}, _parse_both)
