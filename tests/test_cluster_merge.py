"""On Hopper, a fixed split of 2, 4 or 8 pieces on the few-row kernel (H * S_q <= 16, fp16/bf16) merges inside
thread-block clusters: each CTA keeps its normalised rows in shared memory and the cluster's CTAs merge them through
distributed shared memory, with no fp32 partials and no combine kernel. Each case checks the float64 reference and
which path ran (tests/support/launch_paths.py counts it). Sequences are ragged (seq_lens with a fixed split), so some
pieces see no key; caches are poisoned beyond every sequence's length."""

from __future__ import annotations

import pytest

from tests.support.axes import DTYPE_IDS, DTYPES_16
from tests.support.checks import assert_repeatable
from tests.support.launch_paths import PORTABLE, check_on_path, requires_hopper
from tests.support.make_inputs import make_problem

CAPACITY = 1024
# Full, odd, empty, one key, only the first piece, nearly full.
LENS = [1024, 517, 0, 1, 33, 1000]


@requires_hopper
@pytest.mark.parametrize("pieces", [2, 4, 8])
@pytest.mark.parametrize("num_heads", [1, 8, 16])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_pieces_merge_in_cluster(dtype, num_heads, pieces, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=LENS, num_heads=num_heads)
    check_on_path(problem, CAPACITY // pieces, PORTABLE, merged=True, what=f"{pieces} pieces, {num_heads} heads")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_wide_grid_merges_in_cluster(dtype, gen):
    """36 sequences of 4 pieces: 144 CTAs, more than one per SM, so the two-CTAs-per-SM configuration runs."""
    lens = LENS * 6
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=lens, num_heads=16)
    check_on_path(problem, CAPACITY // 4, PORTABLE, merged=True, what="wide grid, 4 pieces")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_causal_two_tokens_merge_in_cluster(dtype, gen):
    """S_q = 2, H = 8: 16 rows whose key limits differ by one; the last key of a row may open a piece."""
    lens = [1024, 65, 257, 256, 1]
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=lens, num_heads=8, seqlen_q=2, causal=True)
    check_on_path(problem, CAPACITY // 4, PORTABLE, merged=True, what="causal S_q = 2, 4 pieces")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_hidden_pages_merge_in_cluster(dtype, gen):
    """32-key pages (31 used by the longest sequence, one spare slot: capacity 1024), some hidden (block_table -1):
    a piece whose pages are all hidden sees no key."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[992, 130, 64], num_heads=16, page_size=32)
    assert problem.block_table.shape[1] * 32 == CAPACITY
    for b, page in [(0, 0), (0, 4), (0, 5), (0, 6), (0, 7), (0, 30), (1, 1), (2, 0), (2, 1)]:
        problem.block_table[b, page] = -1
    check_on_path(problem, CAPACITY // 8, PORTABLE, merged=True, what="hidden pages, 8 pieces")


@requires_hopper
@pytest.mark.parametrize("kv_len_per_split", [64, 352], ids=["16_pieces", "3_pieces"])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_other_piece_counts_use_the_combine(dtype, kv_len_per_split, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=LENS, num_heads=16)
    check_on_path(problem, kv_len_per_split, PORTABLE, merged=False, what=f"split {kv_len_per_split}")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_long_pieces_use_the_combine(dtype, gen):
    """Two pieces of 4096 keys: longer than the cluster merge takes (kClusterMergeMaxKeys)."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[8192, 5000, 4097], num_heads=16)
    check_on_path(problem, 4096, PORTABLE, merged=False, what="two pieces of 4096 keys")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_cluster_merge_is_deterministic(dtype, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=LENS, num_heads=16)
    assert_repeatable(problem, kv_len_per_split=CAPACITY // 8)
