"""The two rich consoles: results on stdout, progress and errors on stderr."""

from __future__ import annotations

from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)
