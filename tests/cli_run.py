"""Run the CLI's main() in-process as a user's shell would see it: exit code, stdout, stderr."""

from __future__ import annotations

import pytest

from sparkfleet.cli.main import main


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
