"""The login user on a node: `id -un`."""

from __future__ import annotations

COMMAND = ["id", "-un"]


def parse(stdout: str) -> str:
    """The user name."""
    return stdout.strip()
