"""The typer groups every command tree is made of: the root and each sub-app (bench, eval, …).

Both choices here keep `--help` fast: help is click's plain text, not typer's rich panels
(typer.rich_utils alone costs more than the 0.3 s a `--help` may take on a loaded 2-core
machine), and a group's absent --help flag never wakes pydantic.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup, TyperOption


class Group(TyperGroup):
    """A group whose --help flag defaults to False rather than None."""

    def get_help_option(self, ctx: Any) -> TyperOption | None:  # click's Context, which typer vendors privately
        option = super().get_help_option(ctx)
        if option is not None:
            # typer coerces a flag whose value is not yet a bool through a pydantic TypeAdapter,
            # which costs `sparkfleet CMD --help` the whole pydantic import.
            option.default = False
        return option


def group(help: str, **settings: Any) -> typer.Typer:
    """A typer app that prints its help as plain text and shows it when given no command."""
    return typer.Typer(cls=Group, help=help, rich_markup_mode=None, no_args_is_help=True, **settings)
