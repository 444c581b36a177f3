"""On Hopper, a fixed split of 2 pieces of at most 2048 keys on the sm_90a kernel (more than 16 query rows per
sequence, fp16/bf16) runs in thread-block clusters of a (sequence, row block)'s two pieces, which merge through
distributed shared memory with no fp32 partials and no combine kernel. A call with seq_lens (several sequences) runs
its work items in clusters of two: each sequence the planner cuts in exactly two pieces merges in its cluster, the
combine takes the others. Each case checks the float64 reference and which path ran (tests/support/launch_paths.py).
Sequences are ragged (some pieces see no key) and caches are poisoned beyond every sequence's length."""

from __future__ import annotations

import random

import pytest
import torch

from tests.support.axes import DTYPE_IDS, DTYPES_16
from tests.support.checks import assert_repeatable
from tests.support.launch_paths import CLUSTER_MERGE, ITEM_PAIRS, SM90, check_on_path, launches_during, requires_hopper
from tests.support.make_inputs import make_problem

# Full, odd, empty, one key, only the first piece, nearly full (capacity 1024).
LENS = [1024, 517, 0, 1, 65, 1000]
# The determinism tests repeat each decode this often after the first; every call must take the path under test.
REPEATS = 3


@requires_hopper
@pytest.mark.parametrize("num_heads", [24, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_two_pieces_merge_in_clusters(dtype, num_heads, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=LENS, num_heads=num_heads)
    check_on_path(problem, 512, SM90, merged=True, what=f"2 pieces, {num_heads} heads")


@requires_hopper
@pytest.mark.parametrize("batch, seqlen", [(28, 1024), (23, 4096)])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_default_split_of_two_pieces_merges(dtype, batch, seqlen, gen):
    """H = 128 without seq_lens: the shape-only planner cuts each sequence in two, one wave of 92-112 CTAs (at B = 23,
    S = 4K it weighs the merge against two waves of 5 pieces)."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[seqlen] * batch, num_heads=128)
    check_on_path(problem, None, SM90, merged=True, what=f"default split, B = {batch}, S = {seqlen}")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_causal_tokens_merge_in_clusters(dtype, gen):
    """S_q = 2, H = 64: two row blocks whose key limits differ by one; the last key of a row may open a piece."""
    lens = [1024, 513, 257, 512, 1]
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=lens, num_heads=64, seqlen_q=2, causal=True)
    check_on_path(problem, 512, SM90, merged=True, what="causal S_q = 2")


@requires_hopper
@pytest.mark.parametrize("cache_layout", ["separate", "fused"])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_hidden_pages_merge_in_clusters(dtype, cache_layout, gen):
    """64-key pages, some hidden (block_table -1): a piece whose pages are all hidden sees no key."""
    problem = make_problem(
        gen, device="cuda", dtype=dtype, lens=[960, 130, 600], num_heads=128, page_size=64, cache_layout=cache_layout
    )
    assert problem.block_table.shape[1] * 64 == 1024
    hidden = [(0, 0), (0, 4), (0, 9), (0, 10), (1, 1)] + [(2, page) for page in range(8)]  # (2, *): piece 0 empty
    for b, page in hidden:
        problem.block_table[b, page] = -1
    check_on_path(problem, 512, SM90, merged=True, what=f"hidden pages, {cache_layout} cache")


@requires_hopper
@pytest.mark.parametrize("kv_len_per_split", [384, 256, 128, 64], ids=["3_pieces", "4", "8", "16"])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_more_pieces_use_the_combine(dtype, kv_len_per_split, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=LENS, num_heads=128)
    check_on_path(problem, kv_len_per_split, SM90, merged=False, what=f"split {kv_len_per_split}")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_long_pieces_use_the_combine(dtype, gen):
    """Two pieces of 4096 keys: longer than the cluster merge takes (kClusterMergeMaxKeys)."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[8192, 5000, 4097], num_heads=64)
    check_on_path(problem, 4096, SM90, merged=False, what="two pieces of 4096 keys")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_sm90_cluster_merge_is_deterministic(dtype, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=LENS, num_heads=128)
    _, launched = launches_during(lambda: assert_repeatable(problem, repeats=REPEATS, kv_len_per_split=512))
    assert launched[SM90] == 1 + REPEATS and launched[CLUSTER_MERGE] == 1 + REPEATS, launched


@requires_hopper
@pytest.mark.parametrize("num_heads, seqlen_q, batch", [(128, 1, 24), (64, 1, 50), (24, 1, 50), (64, 2, 24)])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_work_items_of_two_pieces_merge_in_clusters(dtype, num_heads, seqlen_q, batch, gen):
    """With seq_lens, equal lengths of 1000 keys that the work-item planner cuts in two: at 128 rows (two row blocks,
    66 items a wave) B = 24 plans 384-key pieces, 72 items, and lengthens them to 448 (2 pieces each, 48 items); at
    24-64 rows (132 items a wave) B = 50 plans 448 keys (2 pieces each). Causal S_q = 2 at 64 heads: two row blocks
    whose key limits differ by one."""
    problem = make_problem(
        gen,
        device="cuda",
        dtype=dtype,
        lens=[1000] * batch,
        num_heads=num_heads,
        seqlen_q=seqlen_q,
        causal=seqlen_q > 1,
        dense_slack=24,
    )
    assert problem.seq_lens is not None
    check_on_path(problem, None, SM90, merged=False, pairs=True, what=f"B = {batch}, {num_heads} heads")


@requires_hopper
@pytest.mark.parametrize("page_size, cache_layout", [(None, "separate"), (64, "fused")], ids=["dense", "page64"])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_ragged_work_item_pairs(dtype, page_size, cache_layout, gen):
    """H = 128, a ragged batch of 29 (22 200-26 800 keys, planned in chunks of 384 or 448 keys for a wave of 66
    items): 20 sequences of 700-900 keys (2 pieces each, paired first), 4 of 2048 (5 pieces each: after the pairs, an
    odd count, so the clusters from there on hold pieces of different sequences, or a piece and a spare), 4 of 1-150
    keys and an empty one (one piece each); 65 items."""
    rng = random.Random(int(torch.randint(1 << 30, (1,), generator=gen)))
    lens = [rng.randint(700, 900) for _ in range(20)] + [2048] * 4 + [rng.randint(1, 150) for _ in range(4)] + [0]
    rng.shuffle(lens)
    problem = make_problem(
        gen, device="cuda", dtype=dtype, lens=lens, num_heads=128, page_size=page_size, cache_layout=cache_layout
    )
    check_on_path(problem, None, SM90, merged=False, pairs=True, what=f"lens {lens}")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_ragged_work_item_pairs_over_two_planner_warps(dtype, gen):
    """H = 64, a ragged batch of 50 (31 000-39 000 keys, planned in chunks of 320 keys for a wave of 132 items) by the
    planner's CTA of two warps, so pairs and other long sequences sit in both: 20 sequences of 600-780 keys (2 pieces
    each, items 0-39), 10 of 900-1100 (3 pieces) and 5 of 2048 (6 pieces) after them in batch order (items 40-99;
    from items 42-43 on, clusters may hold two sequences' pieces), 12 of 1-150 keys and 3 empty (one piece each);
    115 items."""
    rng = random.Random(int(torch.randint(1 << 30, (1,), generator=gen)))
    lens = (
        [rng.randint(600, 780) for _ in range(20)]
        + [rng.randint(900, 1100) for _ in range(10)]
        + [2048] * 5
        + [rng.randint(1, 150) for _ in range(12)]
        + [0] * 3
    )
    rng.shuffle(lens)
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=lens, num_heads=64)
    check_on_path(problem, None, SM90, merged=False, pairs=True, what=f"lens {lens}")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_work_item_pairs_are_deterministic(dtype, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[1000] * 23 + [517], num_heads=128)
    _, launched = launches_during(lambda: assert_repeatable(problem, repeats=REPEATS))
    assert launched[SM90] == 1 + REPEATS and launched[ITEM_PAIRS] == 1 + REPEATS, launched
