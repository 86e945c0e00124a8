"""Optional extras: a command that needs one says which to install before it does any work."""

from __future__ import annotations

import importlib.util

from sparkfleet.errors import UsageError


def require_extra(extra: str, modules: tuple[str, ...], what: str) -> None:
    """Raise a one-line error naming ``pip install 'sparkfleet[extra]'`` when a module is missing.

    Checked up front (find_spec imports nothing, so start-up stays fast) rather than where the
    module is first imported: a needle run or a bench lookup must not run to the end and then fail.
    """
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"{what} needs the [{extra}] extra ({', '.join(missing)} not installed): pip install 'sparkfleet[{extra}]'"
        )
