"""CLI commands for export k8s/slurm (issue 8)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app (none yet)."""
    return None
