"""Write a Llama-architecture GGUF with random weights and a made-up tokenizer, without downloading.

Used by ``benchmarks/gpu_device_run.sh`` (docs/gpu-run.md): the device machine has no network, so
the model served there is generated on the spot with llama.cpp's own ``gguf-py`` (put its folder
on ``PYTHONPATH``) and numpy.

The weights are random but not arbitrary: the attention and MLP output projections are scaled
down so that each layer adds only a small perturbation to the residual stream, and the output
layer is tied to the token embeddings. The last position's hidden state then stays closest to
its own input token's embedding, so greedy decoding repeats the prompt's last token. That makes
the smoke test meaningful (``... is 42`` → `` 42 42 42``: the server really ran these weights)
while every layer does the full amount of work a real model of the shape does.

The tokenizer is a SentencePiece-style ("llama") vocabulary: ``<unk> <s> </s>``, the 256 byte
tokens, printable ASCII, the numbers 0…99999 as ``▁N`` and the most frequent words of the
bench corpus (prefix-closed, so the SPM merges reach every piece); anything else falls back to
bytes. Tensors of one kind are drawn once and shared by every layer: writing a 15 GB file then
takes seconds, and speed does not depend on the values.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHAPES = {
    # Llama-3-8B's dimensions (vocabulary 128256, GQA 32/8 heads, 14336 MLP).
    "llama3-8b": dict(d=4096, layers=32, heads=32, kv_heads=8, ff=14336, vocab=128256),
    # Small enough for a CPU rehearsal.
    "tiny": dict(d=512, layers=4, heads=8, kv_heads=4, ff=1536, vocab=128256),
}
OUT_SCALE = 0.02  # output projections: 2 % of a standard init, so the residual keeps the input token
SPACE = "\u2581"
N_NUMBERS = 100_000


@dataclass(frozen=True)
class Shape:
    d: int
    layers: int
    heads: int
    kv_heads: int
    ff: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.d // self.heads

    def params(self) -> int:
        hd = self.head_dim
        per_layer = 2 * self.d * self.d + 2 * self.d * self.kv_heads * hd + 3 * self.d * self.ff + 2 * self.d
        return self.vocab * self.d + self.layers * per_layer + self.d


def corpus_words(limit: int) -> list[str]:
    """The most frequent words of sparkfleet's bench haystack (Python docs prose and source)."""
    try:
        from importlib import resources

        base = resources.files("sparkfleet.data.bench")
        names = ("prose.txt.gz", "code.txt.gz")
        text = " ".join(gzip.decompress(base.joinpath(n).read_bytes()).decode() for n in names)
    except (ImportError, FileNotFoundError):
        text = Path(__file__).read_text()
    counts = collections.Counter(re.findall(r"[A-Za-z_]+", text))
    return [w for w, _ in counts.most_common(limit)]


def vocabulary(size: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, types) of exactly ``size`` entries."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    seen = set(tokens)

    def add(piece: str) -> None:
        if piece not in seen and len(tokens) < size:
            seen.add(piece)
            tokens.append(piece)
            types.append(1)

    for ch in [SPACE] + [chr(c) for c in range(33, 127)]:
        add(ch)
    for n in range(N_NUMBERS):
        add(f"{SPACE}{n}")
    for word in corpus_words(size):
        for end in range(1, len(word) + 1):  # prefix-closed: ▁w, ▁wo, ▁wor, …
            add(SPACE + word[:end])
        if len(tokens) >= size:
            break
    n = N_NUMBERS
    while len(tokens) < size:
        add(f"{SPACE}{n}")
        n += 1
    # SPM merges the pair whose result scores highest: longer pieces later, lower scores.
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return tokens, scores, types


def write(path: Path, shape: Shape, seed: int) -> None:
    import gguf  # llama.cpp's gguf-py, from the source tree

    rng = np.random.default_rng(seed)
    hd = shape.head_dim

    def normal(rows: int, cols: int, std: float) -> np.ndarray:
        out = np.empty((rows, cols), dtype=np.float16)
        step = max(1, (1 << 24) // cols)
        for r in range(0, rows, step):  # in slices: the f32 draw of a whole embedding is 2 GB
            block = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32)
            block *= std
            out[r : r + step] = block
        return out

    tokens, scores, types = vocabulary(shape.vocab)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"sparkfleet random llama d{shape.d} L{shape.layers}")
    writer.add_context_length(131072)
    writer.add_embedding_length(shape.d)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(hd)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(1)  # mostly f16
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)

    d, ff = shape.d, shape.ff
    ones = np.ones(d, dtype=np.float32)
    embd = normal(shape.vocab, d, 1.0)  # tied: also the output layer
    q = normal(shape.heads * hd, d, d**-0.5)
    k = normal(shape.kv_heads * hd, d, d**-0.5)
    v = normal(shape.kv_heads * hd, d, d**-0.5)
    o = normal(d, shape.heads * hd, OUT_SCALE * (shape.heads * hd) ** -0.5)
    gate = normal(ff, d, d**-0.5)
    up = normal(ff, d, d**-0.5)
    down = normal(d, ff, OUT_SCALE * ff**-0.5)
    writer.add_tensor("token_embd.weight", embd)
    writer.add_tensor("output_norm.weight", ones)
    for i in range(shape.layers):
        for name, tensor in (("attn_norm", ones), ("attn_q", q), ("attn_k", k), ("attn_v", v), ("attn_output", o),
                             ("ffn_norm", ones), ("ffn_gate", gate), ("ffn_up", up), ("ffn_down", down)):  # fmt: skip
            writer.add_tensor(f"blk.{i}.{name}.weight", tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--info", type=Path, help="also write what was made as JSON here")
    args = parser.parse_args(argv)
    shape = Shape(**SHAPES[args.shape])
    started = time.monotonic()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write(args.out, shape, args.seed)
    size = args.out.stat().st_size
    seconds = time.monotonic() - started
    description = (f"{args.shape} shape, random f16 weights (d {shape.d}, {shape.layers} layers, "
                   f"{shape.heads}/{shape.kv_heads} heads, ff {shape.ff}, vocab {shape.vocab}), "
                   f"{shape.params() / 1e9:.2f} B parameters, {size / 2**30:.2f} GiB GGUF")  # fmt: skip
    print(f"wrote {args.out}: {description}, {seconds:.1f} s")
    if args.info:
        info = {"shape": args.shape, **SHAPES[args.shape], "params": shape.params(), "bytes": size,
                "seconds": round(seconds, 1), "file": str(args.out), "description": description}  # fmt: skip
        args.info.write_text(json.dumps(info, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
