"""The two rich consoles: results on stdout, progress, warnings and errors on stderr."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def warn(text: str) -> None:
    """One ``warning: …`` line on stderr; text is shown as written (no rich markup)."""
    err_console.print(f"[yellow]warning:[/] {escape(text)}", soft_wrap=True, highlight=False)


def plain(text: str, *, err: bool = False) -> None:
    """One line as written (no rich markup, no highlighting, never cut), on stdout or stderr."""
    (err_console if err else console).print(text, markup=False, highlight=False, soft_wrap=True)
