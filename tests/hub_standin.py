"""A stand-in for the Hugging Face Hub's HTTP API (the Hub cannot be reached here), for the real
``huggingface_hub`` client pointed at it by ``HF_ENDPOINT``.

It serves a REAL repository's file list (tests/data/hub/*.json: the names, sizes and LFS flags of
meta-llama/Llama-3.1-8B-Instruct, whose ``original/`` folder holds a second full checkpoint as a
``.pth``) with small synthetic contents: files over 1 MiB shrunk 1024-fold, the small JSON files
at their real sizes (padded), so the listing's sizes and hashes are those of what it serves.

The routes the client uses: ``GET /api/models/REPO/revision/REV`` (the listing with sizes, git
blob ids and LFS sha256) and ``HEAD``/``GET /REPO/resolve/REV/PATH`` (ETag / X-Linked-Etag,
X-Repo-Commit, sizes, ``Range`` for resumes). Every request is counted; ``cut`` makes the next
GET of a file stop half-way (the connection dropped), ``corrupt`` serves other bytes than the
listing's hash.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

LISTINGS = Path(__file__).parent / "data" / "hub"
SHRINK_OVER = 1 << 20
SHRINK = 1024


def _content(name: str, size: int, shards: list[str], shrink: int = SHRINK) -> bytes:
    """Synthetic bytes for one file: valid JSON (the index names the real shards) padded to the
    real size for small files; deterministic noise, 1024 times smaller, for large ones."""
    if size > SHRINK_OVER:
        n = size // shrink
        seed = hashlib.sha256(name.encode()).digest()
        return (seed * (n // len(seed) + 1))[:n]
    if name == "model.safetensors.index.json":
        body = json.dumps({"metadata": {"total_size": 0}, "weight_map": {f"w{i}": s for i, s in enumerate(shards)}})
    elif name.endswith(".json"):
        body = json.dumps({"name": name})
    else:
        body = f"{name}\n"
    return body.encode().ljust(size, b" ") if len(body) < size else body.encode()


@dataclass
class Repo:
    repo: str
    commit: str
    files: dict[str, bytes]
    lfs: dict[str, bool]

    @classmethod
    def load(cls, listing: str = "meta-llama--Llama-3.1-8B-Instruct", shrink: int = SHRINK) -> Repo:
        data = json.loads((LISTINGS / f"{listing}.json").read_text())
        shards = [n for n, _, _ in data["files"] if n.endswith(".safetensors")]
        files = {n: _content(n, size, shards, shrink) for n, size, _ in data["files"]}
        return cls(data["repo"], data["commit"], files, {n: lfs for n, _, lfs in data["files"]})

    def sha256(self, name: str) -> str:
        return hashlib.sha256(self.files[name]).hexdigest()

    def blob_id(self, name: str) -> str:
        data = self.files[name]
        return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()

    def etag(self, name: str) -> str:
        return self.sha256(name) if self.lfs[name] else self.blob_id(name)

    def sibling(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {"rfilename": name, "size": len(self.files[name]), "blobId": self.blob_id(name)}
        if self.lfs[name]:
            out["lfs"] = {"sha256": self.sha256(name), "size": len(self.files[name]), "pointerSize": 134}
        return out


@dataclass
class Hub:
    """The stand-in's state: the repos it serves, what it was asked, and the faults to inject."""

    repos: dict[str, Repo]
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, range)
    tokens: set[str] = field(default_factory=set)  # bearer tokens the requests carried
    served: dict[str, int] = field(default_factory=dict)  # bytes of each file sent in GET bodies
    cut: dict[str, int] = field(default_factory=dict)  # file -> bytes after which its next GET stops
    corrupt: set[str] = field(default_factory=set)
    down: bool = False  # every request answered 503, as during an outage
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    @property
    def bytes_served(self) -> int:
        return sum(self.served.values())


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, code: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _find(self) -> tuple[str, Repo | None, str]:
            path = self.path.split("?", 1)[0]
            for repo in hub.repos.values():
                if path == f"/api/models/{repo.repo}" or path.startswith(f"/api/models/{repo.repo}/revision/"):
                    return "info", repo, path.rsplit("/", 1)[1]
                prefix = f"/{repo.repo}/resolve/"
                if path.startswith(prefix):
                    _rev, _, name = path[len(prefix) :].partition("/")
                    return "file", repo, name
            return "none", None, ""

        def _count(self) -> None:
            with hub.lock:
                hub.requests.append((self.command, self.path, self.headers.get("Range", "")))
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Bearer "):
                    hub.tokens.add(auth[7:])

        def do_GET(self) -> None:
            self._count()
            kind, repo, name = self._find()
            if hub.down:
                self._json(503, {"error": "Service Unavailable"})
            elif repo is None:
                self._json(404, {"error": "Repository not found"})
            elif kind == "info":
                self._json(200, {"id": repo.repo, "modelId": repo.repo, "sha": repo.commit, "private": False,
                                 "siblings": [repo.sibling(n) for n in repo.files]})  # fmt: skip
            elif name not in repo.files:
                self._json(404, {"error": "Entry not found"})
            else:
                self._file(repo, name, body=True)

        def do_HEAD(self) -> None:
            self._count()
            kind, repo, name = self._find()
            if hub.down or repo is None or kind != "file" or name not in repo.files:
                self.send_response(503 if hub.down else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._file(repo, name, body=False)

        def _file(self, repo: Repo, name: str, *, body: bool) -> None:
            data = repo.files[name]
            if name in hub.corrupt:
                data = bytes(b ^ 0xFF for b in data)
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes=") and body:
                start = int(ranged[6:].split("-")[0] or 0)
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{repo.etag(name)}"')
            if repo.lfs[name]:
                self.send_header("X-Linked-Etag", f'"{repo.sha256(name)}"')
                self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            with hub.lock:
                stop = hub.cut.pop(name, None)
            part = data[start:] if stop is None else data[start:stop]
            self.wfile.write(part)
            with hub.lock:
                hub.served[name] = hub.served.get(name, 0) + len(part)
            if stop is not None:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)

    return Handler


@contextmanager
def standin_hub(*listings: str, shrink: int = SHRINK) -> Iterator[Hub]:
    """The stand-in serving the given listings (default: Llama-3.1-8B-Instruct) on a free port,
    files over 1 MiB shrunk `shrink`-fold."""
    repos = [Repo.load(name, shrink) for name in (listings or ("meta-llama--Llama-3.1-8B-Instruct",))]
    hub = Hub({r.repo: r for r in repos})
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
