"""The login user on a node: `id -un`."""

from __future__ import annotations

from sparkfleet.doctor.probes.fact import fixed

COMMAND = ["id", "-un"]


def parse(stdout: str) -> str:
    """The user name."""
    return stdout.strip()


FACT = fixed("user", COMMAND, lambda out: parse(out.stdout))
