"""Which chunks a re-stage hashes against the ledgers: a share of the node's data, not one per file."""

from __future__ import annotations

import random
from collections import Counter
from typing import cast

from sparkfleet.nodes.shipped.layouts import Layout
from sparkfleet.nodes.shipped.sparse_rows import SAMPLE_SHARE, chunk_picks


class _Output:
    """As much of a Layout as choosing chunks looks at: how many chunks it has."""

    def __init__(self, n: int) -> None:
        self.chunks = [(i << 24, 1 << 24) for i in range(n)]


def outputs(*sizes: int) -> list[Layout]:
    return [cast(Layout, _Output(n)) for n in sizes]


def test_four_small_outputs_on_one_node_share_one_sampled_chunk() -> None:
    # tp=4 on one node, 2 GiB in all: 32 chunks of 16 MiB per rank file.
    outs = outputs(32, 32, 32, 32)
    hit: Counter[int] = Counter()
    for seed in range(400):
        picks = chunk_picks(outs, random.Random(seed), full=False)
        assert sum(len(p) for p in picks) == 1
        hit.update(k for k, p in enumerate(picks) if p)
    assert all(70 <= hit[k] <= 130 for k in range(4)), hit  # every file is checked about as often


def test_the_sample_grows_with_the_data() -> None:
    outs = outputs(SAMPLE_SHARE * 3, SAMPLE_SHARE)  # 16 GiB of 16 MiB chunks
    picks = chunk_picks(outs, random.Random(1), full=False)
    assert sum(len(p) for p in picks) == 4
    assert all(p == sorted(set(p)) for p in picks)


def test_verify_hashes_every_chunk_and_an_empty_output_is_no_trouble() -> None:
    outs = outputs(3, 0, 5)
    assert chunk_picks(outs, random.Random(0), full=True) == [[0, 1, 2], [], [0, 1, 2, 3, 4]]
    assert chunk_picks(outputs(0), random.Random(0), full=False) == [[]]
