"""Checkpoint headers read on a node with od/tail/head, and the weights they give per rank."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from sparkfleet.doctor.probes.checkpoint import command as checkpoint_command
from sparkfleet.doctor.probes.checkpoint import parse as parse_checkpoint
from sparkfleet.nodes.transport.local import LocalTransport
from sparkfleet.plan.memory import kv_bytes_per_token, weights_per_rank


def test_headers_of_every_shard_and_the_config_come_back(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    snap = hf / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64}
    (snap / "config.json").write_text(json.dumps(config))
    save_file({"a.weight": np.zeros((128, 64), dtype=np.float16)}, str(snap / "model-00001-of-00002.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    save_file({"b.weight": np.zeros((10,), dtype=np.float32), "layers.1.engram.embed.weight":
               np.zeros((1000, 8), dtype=np.uint8)}, str(snap / "model-00002-of-00002.safetensors"))  # fmt: skip

    out = LocalTransport().run(checkpoint_command(str(hf), "org/tiny")).stdout
    got_config, tensors = parse_checkpoint(out)
    assert got_config == config
    assert tensors == {"a.weight": 128 * 64 * 2, "b.weight": 40, "layers.1.engram.embed.weight": 8000}
    assert weights_per_rank(tensors, 2, ["*.engram.*"]) == (16384 + 40) // 2
    assert kv_bytes_per_token(got_config, 2, 2) == 2 * 2 * 1 * 16 * 2  # 2 layers, 1 KV head/rank, dim 16


def test_no_snapshot_gives_nothing(tmp_path: Path) -> None:
    out = LocalTransport().run(checkpoint_command(str(tmp_path), "org/absent")).stdout
    assert parse_checkpoint(out) == (None, None)
