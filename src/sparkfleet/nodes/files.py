"""Files and folders on a node, as commands (with a pure ``parse_*`` beside those whose output
needs reading): what staging and distribution read and write there. ``apply/`` decides what to
do with the answers and never writes a command itself.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import threading
from collections.abc import Callable, Sequence

from sparkfleet.nodes.transport.base import Result, Stream, Transport

PARTIAL_DIR = ".sparkfleet-partial"  # where rsync keeps an interrupted file until it is whole
_IO_TIMEOUT_S = 120
_PROGRESS = re.compile(rb"^\s*([\d,]+)\s+\d+%")


def read_text(transport: Transport, path: str, timeout: float = 30) -> str | None:
    """The file's text, or None where it cannot be read."""
    result = transport.run(["cat", path], check=False, timeout=timeout)
    return result.stdout if result.ok else None


def make_dir(transport: Transport, path: str) -> Result:
    """``mkdir -p path`` (unchecked: the caller says what the folder was for)."""
    return transport.run(["mkdir", "-p", path], check=False, timeout=60)


def make_marker(transport: Transport, folder: str, marker: str) -> bool:
    """Create folder and an empty marker file in it; False where that cannot be written."""
    return transport.run(["sh", "-c", 'mkdir -p "$1" && : > "$2"', "sh", folder, marker], check=False,
                         timeout=60).ok  # fmt: skip


def exists(transport: Transport, path: str) -> bool:
    return transport.run(["test", "-e", path], check=False, timeout=60).ok


def is_dir(transport: Transport, path: str) -> bool:
    return transport.run(["test", "-d", path], check=False, timeout=60).ok


def remove(transport: Transport, *paths: str) -> None:
    """``rm -f`` the paths (what is not there is no error)."""
    transport.run(["rm", "-f", "--", *paths], check=False, timeout=60)


def readable(transport: Transport, paths: Sequence[str]) -> set[str]:
    """Those of paths this node's user can read."""
    if not paths:
        return set()
    script = 'for p; do [ -r "$p" ] && printf "%s\\n" "$p"; done; true'
    return set(transport.run(["sh", "-c", script, "sh", *paths], check=False, timeout=60).stdout.splitlines())


def sha256_of(transport: Transport, paths: Sequence[str]) -> Result:
    """``sha256sum`` of each path that is a file (the others are left out); see ``parse_sha256sum``."""
    script = 'for p; do [ -f "$p" ] && sha256sum -- "$p"; done; true'
    return transport.run(["sh", "-c", script, "sh", *paths], check=False, timeout=300)


def parse_sha256sum(text: str) -> dict[str, str]:
    """{path: hex digest} from ``sha256sum`` output (text or ``*``binary mode)."""
    hashes = {}
    for line in text.splitlines():
        digest, _, path = line.partition("  ")
        if path or digest:
            hashes[path.lstrip("*")] = digest
    return hashes


# size, mtime, type, link target and path of each path itself (links not followed)
_FIND_STAT = (
    'cd "$1" || { echo "cannot enter $1" >&2; exit 4; }; shift; '
    "find \"$@\" -maxdepth 0 -printf '%s\\t%T@\\t%y\\t%l\\t%p\\n' 2>/dev/null; true"
)


def stat_entries(transport: Transport, root: str, paths: Sequence[str]) -> Result:
    """One line per path under root that exists (see ``parse_stat_entries``)."""
    return transport.run(["sh", "-c", _FIND_STAT, "sh", root, *[f"./{p}" for p in paths]], check=False, timeout=600)


def parse_stat_entries(text: str) -> dict[str, tuple[int, int, str | None]]:
    """{path: (size, mtime, link target or None)}; a link is known by its target alone."""
    out: dict[str, tuple[int, int, str | None]] = {}
    for line in text.splitlines():
        size, mtime, kind, link, path = line.split("\t", 4)
        if kind == "l":
            out[path.removeprefix("./")] = (0, 0, link)
        else:
            out[path.removeprefix("./")] = (int(size), int(float(mtime)), None)
    return out


def snapshot_check(transport: Transport, root: str, paths: Sequence[str], hashed: Sequence[str],
                   hash_limit: int) -> Result:  # fmt: skip
    """Under root: ``S\\tpath\\tsize`` per path (links followed), ``L\\tpath\\ttarget`` per link,
    and ``H\\tdigest  path`` for the files named one of hashed under hash_limit bytes. Exit 4
    when root cannot be entered. stat, find and sha256sum: no interpreter to start."""
    names = " -o ".join(f"-name {shlex.quote(p)}" for p in hashed)
    script = (
        'cd "$1" || { echo "cannot enter $1" >&2; exit 4; }; shift; '
        "stat -L -c 'S\t%n\t%s' -- \"$@\" 2>/dev/null; "
        "find \"$@\" -maxdepth 0 -type l -printf 'L\\t%p\\t%l\\n' 2>/dev/null; "
        f'find -L "$@" -maxdepth 0 -type f \\( {names} \\) -size -{hash_limit // 1024 + 1}k -print0 '
        "2>/dev/null | xargs -0 -r sha256sum -- | sed 's/^/H\t/'; true"
    )
    return transport.run(["sh", "-c", script, "sh", root, *paths], check=False, timeout=300)


def tar_out(transport: Transport, folder: str) -> Stream:
    """A tar of the files of folder named on stdin (NUL separated), on stdout."""
    return transport.stream(["tar", "-C", folder, "--null", "-T", "-", "-cf", "-"], stdin=True, merge_stderr=False)


def tar_in(transport: Transport, folder: str) -> Stream:
    return transport.stream(["tar", "-C", folder, "-xpf", "-"], stdin=True, merge_stderr=False)


def rsync_argv(src: str, dest: str, ssh: str | None, make_dest: str | None = None) -> list[str]:
    """rsync words: exact file list on stdin (NUL separated), archive mode, resumable partials;
    with make_dest, the receiver creates that folder first (no extra SSH round trip).
    ``--modify-window=-1`` compares mtimes to the nanosecond: at whole seconds, a table rewritten
    at the same size within a second of the last sync looked unchanged and was never sent."""
    words = [
        "rsync", "-a", "--modify-window=-1", "--from0", "--files-from=-", f"--partial-dir={PARTIAL_DIR}",
        f"--timeout={_IO_TIMEOUT_S}", "--info=progress2", "--stats", "--no-human-readable",
    ]  # fmt: skip
    if ssh:
        words += ["-e", ssh]
    if make_dest:
        words.append(f"--rsync-path=mkdir -p {shlex.quote(make_dest)} && rsync")
    return [*words, src.rstrip("/") + "/", dest.rstrip("/") + "/"]


def in_new_folder(folder: str, argv: Sequence[str]) -> list[str]:
    """argv, run once folder exists (created first)."""
    return ["sh", "-c", 'mkdir -p "$1" && shift && exec "$@"', "sh", folder, *argv]


def node_side_ssh(source: Transport, words: Sequence[str]) -> str:
    """The ssh command the source node runs (rsync's push, a pipeline hop) to reach the node whose
    controller-side ssh words are ``words``: its user and port, and the controller's ssh_config
    and key only where the source node can read the same path."""
    present = readable(source, [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-F", "-i")])
    out = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    config = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "-F"), None)
    if config is None or config not in present:
        # No ssh_config of ours there to say how host keys are checked: learn a node's key on first
        # contact (a changed key is still refused).
        out += ["-o", "StrictHostKeyChecking=accept-new"]
    i = 1
    while i < len(words) - 1:
        flag, value = words[i], words[i + 1]
        if (flag in ("-F", "-i") and value in present) or flag in ("-p", "-l"):
            out += [flag, value]
        i += 2 if flag in ("-F", "-i", "-p", "-l", "-o") else 1
    return shlex.join(out)


def _pump(stream: Stream, on_bytes: Callable[[int], None] | None, sink: list[bytes]) -> None:
    buf = b""
    while chunk := stream.read(65536):
        sink.append(chunk)
        buf += chunk
        *lines, buf = re.split(rb"[\r\n]", buf)
        for line in lines:
            m = _PROGRESS.match(line)
            if m and on_bytes is not None:
                on_bytes(int(m.group(1).replace(b",", b"")))


def run_rsync(transport: Transport, argv: list[str], files: Sequence[str],
              on_bytes: Callable[[int], None] | None) -> tuple[int, str, str]:  # fmt: skip
    """Run an rsync argv on the transport's node with the file list fed on stdin; its exit code,
    stdout and stderr, with ``--info=progress2``'s byte counts passed to on_bytes as they come.
    TransportError when it cannot be started."""
    stream = transport.stream(argv, stdin=True, merge_stderr=False)
    out: list[bytes] = []
    reader = threading.Thread(target=_pump, args=(stream, on_bytes, out), daemon=True)
    reader.start()
    with contextlib.suppress(BrokenPipeError):  # rsync died early: its exit code and stderr say why
        stream.write(b"\0".join(p.encode() for p in files) + b"\0")
    stream.close_stdin()
    code = stream.wait()
    reader.join()
    return code, b"".join(out).decode(errors="replace"), stream.errors()
