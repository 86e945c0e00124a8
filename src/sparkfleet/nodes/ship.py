"""The one way sparkfleet runs its own code on a node: ``python3 [-S] -c PROGRAM ARGS…``.

A ``ShippedProgram`` names modules of ``sparkfleet.nodes.shipped`` (standard library only) in
dependency order, joined once into one script whose last module's main block is the entry
point. Stdin stays free for data (an env file, a payload), so nothing secret sits in argv.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files

from sparkfleet.nodes.transport.base import Result, Stream, Transport

# One argv word is at most 128 KiB on Linux (MAX_ARG_STRLEN); ssh hands the whole remote command
# to the node's shell as one word, so a program must stay well under that.
MAX_PROGRAM_BYTES = 100_000
_FUTURE = "from __future__ import annotations\n"
_INTERNAL_IMPORT = re.compile(r"^from sparkfleet\.nodes\.shipped\.\w+ import (\([^)]*\)|[^\n]*)\n", re.M)
_MAIN = re.compile(r"^if __name__ == \"__main__\":", re.M)
_CODE_ONLY = re.compile(r"#.*|\"\"\"[\s\S]*?\"\"\"")
_PACKAGE_REF = re.compile(r"\bsparkfleet\.\w|\bimport sparkfleet\b")


@dataclass(frozen=True)
class ShippedProgram:
    """A program made of node-side modules; the last module's main block runs.

    site: start the node's interpreter with its site-packages (optional speed-ups such as numpy or
    xxhash); without, ``-S`` halves start-up for code that needs only the standard library.
    """

    name: str
    modules: tuple[str, ...]
    site: bool = False


NODE_AGENT = ShippedProgram("node-agent", ("agent",))
STAGE_WORKER = ShippedProgram(
    "stage-worker", ("failure", "safetensors_index", "ledger", "disk", "layouts", "sparse_rows"), site=True
)
COMPOSE_WORKER = ShippedProgram("compose-worker", ("failure", "composed_worker"))
SNAPSHOT_SCAN = ShippedProgram("snapshot-scan", ("snapshot_scan",))
# site: huggingface_hub is in the node's site-packages.
HUB_FETCH = ShippedProgram("hub-fetch", ("hub_fetch",), site=True)
# Run by the engine's own Python (torch from its site-packages), its text on stdin.
COLLECTIVE_SWEEP = ShippedProgram("collective-sweep", ("collective_sweep",), site=True)
LINK_STREAM = ShippedProgram("link-stream", ("link_stream",))


@functools.cache
def program_text(program: ShippedProgram) -> str:
    """The program's one script (also runnable as ``python3 - ARGS…`` with it on stdin)."""
    package = files("sparkfleet.nodes.shipped")
    parts = [_FUTURE]
    for i, name in enumerate(program.modules):
        text = package.joinpath(f"{name}.py").read_text(encoding="utf-8")
        text = _INTERNAL_IMPORT.sub("", text.replace(_FUTURE, "", 1))
        code = _CODE_ONLY.sub("", text)
        if _PACKAGE_REF.search(code):
            raise AssertionError(f"nodes/shipped/{name}.py refers to sparkfleet outside its imports")
        if i < len(program.modules) - 1 and _MAIN.search(text):
            raise AssertionError(f"nodes/shipped/{name}.py has a main block but is not {program.name}'s last module")
        parts.append(f"# ---- {name}.py ----\n{text}")
    joined = "\n".join(parts)
    size = len(joined.encode())
    if size > MAX_PROGRAM_BYTES:
        raise AssertionError(f"{program.name} is {size} bytes, over {MAX_PROGRAM_BYTES} for one argv word")
    return joined


def shipped_argv(python: str, program: ShippedProgram, args: Sequence[str] = ()) -> list[str]:
    """The words that run program on a node with its python."""
    return [python, *([] if program.site else ["-S"]), "-c", program_text(program), *args]


def run_shipped(transport: Transport, python: str, program: ShippedProgram, args: Sequence[str] = (), *,
                stdin: bytes | None = None, timeout: float | None = None) -> Result:  # fmt: skip
    """Run program on the transport's node; its Result, never checked (each program reports its
    own failures in its output, which the caller reads)."""
    return transport.run(shipped_argv(python, program, args), stdin=stdin, timeout=timeout, check=False)


def stream_shipped(transport: Transport, python: str, program: ShippedProgram, stdin: bytes) -> Stream:
    """Start program on the transport's node with stdin written and closed; its output as it
    comes (a long program that reports progress line by line)."""
    stream = transport.stream(shipped_argv(python, program), stdin=True, merge_stderr=False)
    stream.write(stdin)
    stream.close_stdin()
    return stream
