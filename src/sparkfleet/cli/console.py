"""The two rich consoles: results on stdout, progress, warnings and errors on stderr."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from rich.console import Console, JustifyMethod
from rich.markup import escape

if TYPE_CHECKING:
    from rich.table import Table

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def warn(text: str) -> None:
    """One ``warning: …`` line on stderr; text is shown as written (no rich markup)."""
    err_console.print(f"[yellow]warning:[/] {escape(text)}", soft_wrap=True, highlight=False)


def plain(text: str, *, err: bool = False) -> None:
    """One line as written (no rich markup, no highlighting, never cut), on stdout or stderr."""
    (err_console if err else console).print(text, markup=False, highlight=False, soft_wrap=True)


def table(title: str | None, *columns: str, left: Collection[str] | None = None,
          title_justify: JustifyMethod = "left") -> Table:  # fmt: skip
    """A rich table with these column headers: each left-aligned, or only those in left (the rest right)."""
    from rich.table import Table  # only a command that draws one pays for it

    out = Table(title=title, title_justify=title_justify)
    for col in columns:
        out.add_column(col, justify="left" if left is None or col in left else "right")
    return out
