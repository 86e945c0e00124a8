"""Facts about a node that are not a rank's: a command and a pure parser each (pyinfra's facts),
the parser tested on captured real output."""

from __future__ import annotations

from sparkfleet.nodes.transport.base import Transport

MEMINFO = ["cat", "/proc/meminfo"]


def parse_mem_available(meminfo: str) -> int:
    """MemAvailable in bytes from the text of /proc/meminfo (ValueError when it has none)."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                unit = parts[2].lower() if len(parts) > 2 else "kb"
                return int(parts[1]) * (1024 if unit == "kb" else 1)
    raise ValueError("no MemAvailable line in /proc/meminfo")


def mem_available(transport: Transport) -> int:
    """The node's MemAvailable in bytes (on a GB10 what CUDA can still allocate)."""
    return parse_mem_available(transport.run(MEMINFO, timeout=10).stdout)
