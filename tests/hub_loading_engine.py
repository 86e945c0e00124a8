"""A stand-in engine rank that first opens its model as SGLang and vLLM do with a repo id:
``huggingface_hub.snapshot_download(repo, revision=...)`` in ``HF_HOME``, which honours
``HF_HUB_OFFLINE`` (asks the Hub for nothing, fails if a file is missing). Then it serves as
tests/standin_engine.py does. Prints ``hub-loading-engine: loaded PATH`` to its log."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

STANDIN = Path(__file__).resolve().parent / "standin_engine.py"


def _arg(flag: str) -> str | None:
    argv = sys.argv[1:]
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


if __name__ == "__main__":
    from huggingface_hub import snapshot_download

    repo = _arg("--model-path") or _arg("--model")
    path = snapshot_download(str(repo), revision=_arg("--revision"))
    print(f"hub-loading-engine: loaded {path}", flush=True)
    sys.argv[0] = str(STANDIN)
    runpy.run_path(str(STANDIN), run_name="__main__")
