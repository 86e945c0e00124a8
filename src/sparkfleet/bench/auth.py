"""Where the API key for a server comes from, without it ever being a word of argv.

``--api-key`` takes where the key is, not the key (argv is what every user of the machine sees
in ``ps``): ``env:NAME`` (an environment variable), ``file:PATH`` (its first line), or ``-`` (one
line on stdin). Without it: ``OPENAI_API_KEY`` as the openai client reads it, then, for a
deployment sparkfleet started, the key its rank 0 was started with (the engine's own variable in
the rank's private env file on the node).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sparkfleet.errors import UsageError

HINT = "pass --api-key env:NAME, file:PATH or - (stdin), or set OPENAI_API_KEY"


def read_key_ref(ref: str) -> str:
    """The key that ref points to; UsageError naming ref's kind when it cannot be read."""
    if ref == "-":
        value = sys.stdin.readline().strip()
        if not value:
            raise UsageError("--api-key -: nothing on stdin")
        return value
    kind, sep, where = ref.partition(":")
    if sep and kind == "env":
        value = os.environ.get(where, "").strip()
        if not value:
            raise UsageError(f"--api-key env:{where}: the variable {where} is not set")
        return value
    if sep and kind == "file":
        try:
            value = Path(where).expanduser().read_text().strip().splitlines()[0].strip()
        except (OSError, IndexError):
            raise UsageError(f"--api-key file:{where}: no such file, or it is empty") from None
        return value
    raise UsageError(
        "--api-key takes where the key is, not the key (a command line is visible to every user "
        "of the machine in `ps`): env:NAME, file:PATH or -"
    )


def api_key_for(ref: str | None) -> str | None:
    """The key of --api-key REF, else OPENAI_API_KEY, else None (the deployment's own may follow)."""
    if ref:
        return read_key_ref(ref)
    return os.environ.get("OPENAI_API_KEY") or None
