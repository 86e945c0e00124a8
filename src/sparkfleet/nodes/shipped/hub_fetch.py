"""Node side of the Hub fetch: which files of a repo the engine loads (``choose``, pure: a repo
often holds a second full checkpoint, ``original/*.pth`` or ``consolidated.safetensors``, that
would double a 150 GB download), and bringing those into the node's Hugging Face cache with
huggingface_hub's own client.

The job comes as one JSON line on stdin (the token never sits in argv). A pinned revision whose
snapshot already holds what the engine loads is answered without the Hub; otherwise each chosen
file comes from ``hf_hub_download`` (which resumes) and is hashed against ``model_info``'s
listing, and a mismatch is removed and refused. ``P <done> <total>`` lines report progress; the
last line is the JSON report.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sys
import threading
import time

# What a safetensors engine (vLLM, SGLang) reads beside the weights: configs, tokenizer, chat template.
METADATA = ("*.json", "*.jinja", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt")
OTHER_CHECKPOINTS = ("*.pth", "*.pt", "*.bin", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.gguf", "*.npz")
INDEX = "model.safetensors.index.json"


def _any(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def choose(names: list[str], profile: list[str | None], index: dict | None = None) -> tuple[list[str], list[list[str]]]:
    """(files to fetch, [[file, why skipped]]) for a repo's file names. profile is
    ``["safetensors", None]`` or ``["gguf", model_file]``; index is the safetensors index's JSON
    when the repo has one (its weight_map names the shards the engine opens)."""
    kind, model_file = profile[0], profile[1]
    fetch: list[str] = []
    skip: list[list[str]] = []
    if kind == "gguf":
        stem = model_file or ""
        split = stem.rsplit("-00001-of-", 1)
        for name in names:
            if name == stem or (len(split) == 2 and name.startswith(split[0] + "-") and name.endswith(".gguf")
                                and "-of-" + split[1] in name):  # fmt: skip
                fetch.append(name)
            elif name.endswith(".gguf"):
                skip.append([name, f"another GGUF file: the recipe's model_file is {stem}"])
            else:
                skip.append([name, "llama.cpp reads only the GGUF file"])
        return fetch, skip
    shards = set((index or {}).get("weight_map", {}).values())
    has_safetensors = any(n.endswith(".safetensors") and "/" not in n for n in names)
    for name in names:
        if "/" in name:
            skip.append([name, f"in {name.split('/')[0]}/: a second copy the engine does not load"])
        elif name.endswith(".safetensors"):
            if shards and name not in shards:
                skip.append([name, f"not named by {INDEX}: a duplicate checkpoint"])
            else:
                fetch.append(name)
        elif name.endswith(".bin") and not has_safetensors and name.startswith("pytorch_model"):
            fetch.append(name)  # no safetensors in this repo: the engine loads the PyTorch shards
        elif _any(name, OTHER_CHECKPOINTS):
            skip.append([name, f"a {name.rsplit('.', 1)[-1]} checkpoint: the engine loads the safetensors"])
        elif _any(name, METADATA):
            fetch.append(name)
        else:
            skip.append([name, "not read by the engine"])
    return fetch, skip


def rules(profile: list[str | None] | tuple[str, str | None]) -> list[tuple[str, str, str]]:
    """``choose``'s rules in words, as ``plan`` shows them before the listing is known:
    (files, fetch or skip, why)."""
    if profile[0] == "gguf":
        return [(str(profile[1]), "fetch", "the recipe's model_file (with its -0000N-of- parts when split)"),
                ("other *.gguf", "skip", "other quants: llama.cpp opens one file"),
                ("everything else", "skip", "llama.cpp reads only the GGUF file")]  # fmt: skip
    return [
        ("*.safetensors at the root", "fetch", f"the shards {INDEX} names (all of them without an index)"),
        (", ".join(METADATA) + " at the root", "fetch", "configs, tokenizer, chat template, generation config"),
        ("anything in a subfolder (original/ …)", "skip", "a second copy the engine does not load"),
        (", ".join(OTHER_CHECKPOINTS), "skip", "other checkpoints (pytorch_model*.bin only without safetensors)"),
        ("everything else (README.md, LICENSE, …)", "skip", "not read by the engine"),
    ]


def repo_dir(cache: str, repo: str) -> str:
    return os.path.join(cache, "models--" + repo.replace("/", "--"))


def present_locally(cache: str, repo: str, revision: str, profile: list[str | None]) -> list[str] | None:
    """The files of a pinned snapshot already in the cache, when they are everything the engine
    loads (every link resolves; the index's shards all there); None otherwise. A link exists only
    once huggingface_hub has moved a finished blob into place, so a cut download is never seen."""
    snap = os.path.join(repo_dir(cache, repo), "snapshots", revision)
    if not os.path.isdir(snap):
        return None
    kind, model_file = profile[0], profile[1]
    if kind == "gguf":
        path = os.path.join(snap, model_file or "")
        return [model_file] if model_file and os.path.isfile(path) else None
    names = sorted(n for n in os.listdir(snap) if os.path.isfile(os.path.join(snap, n)))
    if "config.json" not in names:
        return None
    if INDEX in names:
        with open(os.path.join(snap, INDEX), encoding="utf-8") as f:
            shards = set(json.load(f).get("weight_map", {}).values())
        if not shards <= set(names):
            return None
    elif not any(n.endswith(".safetensors") for n in names):
        return None
    return names


def _digest(path: str, lfs: bool, size: int) -> str:
    h = hashlib.sha256() if lfs else hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def fetch(job: dict) -> dict:
    """Bring the engine's files of job's repo into job's cache; the report (see the module doc)."""
    cache, repo, revision, profile = job["cache"], job["repo"], job.get("revision"), job["profile"]
    if revision and (have := present_locally(cache, repo, revision, profile)) is not None:
        return {"commit": revision, "fetched": [], "present": have, "skipped": [], "bytes": 0, "asked_hub": False}
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        return {"error": f"huggingface_hub is not installed for {sys.executable}: pip install huggingface_hub"}
    token = job.get("token") or None
    api = HfApi(endpoint=job.get("endpoint") or None, token=token)
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True)
    except Exception as exc:
        # No Hub (an offline site, an outage): a complete copy of what the cache names this
        # revision is used as it is, and the report says so.
        ref = os.path.join(repo_dir(cache, repo), "refs", revision or "main")
        local = None
        if os.path.isfile(ref):
            with open(ref, encoding="utf-8") as f:
                local = f.read().strip()
        have = present_locally(cache, repo, local, profile) if local else None
        if have is None:
            raise
        return {"commit": local, "fetched": [], "present": have, "skipped": [], "bytes": 0, "asked_hub": True,
                "note": f"the Hub did not answer ({type(exc).__name__}): using the cache's {revision or 'main'} "
                        f"= {local}, which holds what the engine loads"}  # fmt: skip
    commit = str(info.sha)
    listing = {s.rfilename: s for s in info.siblings or []}
    blobs = os.path.join(repo_dir(cache, repo), "blobs")
    report: dict = {"commit": commit, "fetched": [], "present": [], "skipped": [], "bytes": 0, "asked_hub": True}
    done = 0

    def get(name: str) -> str:
        nonlocal done
        s = listing[name]
        lfs = s.lfs is not None
        want = str(s.lfs.sha256 if s.lfs is not None else s.blob_id)
        blob = os.path.join(blobs, want)
        snap = os.path.join(repo_dir(cache, repo), "snapshots", commit, name)
        if os.path.isfile(blob) and os.path.getsize(blob) == s.size and os.path.exists(snap):
            report["present"].append(name)
            done += s.size
            return snap
        partial = os.path.getsize(blob + ".incomplete") if os.path.exists(blob + ".incomplete") else 0
        path = hf_hub_download(repo, name, revision=commit, cache_dir=cache, token=token,
                               endpoint=job.get("endpoint") or None)  # fmt: skip
        real = os.path.realpath(path)
        got = os.path.getsize(real)
        digest = _digest(real, lfs, got)
        if got != s.size or digest != want:
            for p in (real, path):
                if os.path.lexists(p):
                    os.unlink(p)
            what = "sha256" if lfs else "git blob id"
            raise ValueError(f"{name}: the Hub lists {what} {want} ({s.size} bytes), the download has "
                             f"{digest} ({got} bytes); removed, nothing kept")  # fmt: skip
        report["fetched"].append([name, s.size])
        report["bytes"] += s.size - partial
        done += s.size
        return path

    index = None
    if profile[0] == "safetensors" and INDEX in listing:
        with open(get(INDEX), encoding="utf-8") as f:
            index = json.load(f)
    wanted, report["skipped"] = choose(sorted(listing), profile, index)
    report["skipped"] = [[n, listing[n].size or 0, why] for n, why in report["skipped"]]
    total = sum(listing[n].size or 0 for n in wanted)
    stop = threading.Event()

    def tell() -> None:
        while not stop.wait(0.5):
            try:
                partial = sum(e.stat().st_size for e in os.scandir(blobs) if e.name.endswith(".incomplete"))
            except OSError:
                partial = 0
            print(f"P {done + partial} {total}", flush=True)

    ticker = threading.Thread(target=tell, daemon=True)
    ticker.start()
    try:
        for name in wanted:
            if name != INDEX or index is None:
                get(name)
    finally:
        stop.set()
        ticker.join()
    ref = revision or "main"
    if ref != commit:
        # Files were asked for by commit: name it as the branch or tag the recipe gave, as
        # huggingface_hub does, so the cache resolves the recipe's revision offline.
        os.makedirs(os.path.join(repo_dir(cache, repo), "refs"), exist_ok=True)
        with open(os.path.join(repo_dir(cache, repo), "refs", ref), "w", encoding="utf-8") as f:
            f.write(commit)
    print(f"P {total} {total}", flush=True)
    return report


if __name__ == "__main__":
    job = json.loads(sys.stdin.readline())
    started = time.monotonic()
    try:
        out = fetch(job)
    except Exception as exc:  # the controller shows it as the node's error
        out = {"error": f"{type(exc).__name__}: {exc}"}
    out["seconds"] = time.monotonic() - started
    print(json.dumps(out), flush=True)
