"""On Hopper, a fixed split of 2 pieces of at most 2048 keys on the sm_90a kernel (more than 16 query rows per
sequence, fp16/bf16) runs in thread-block clusters of a (sequence, row block)'s two pieces, which merge through
distributed shared memory with no fp32 partials and no combine kernel. Each case checks the float64 reference and
which path ran (tests/launch_paths.py). Sequences are ragged (some pieces see no key) and caches are poisoned beyond
every sequence's length."""

from __future__ import annotations

import pytest
from axes import DTYPE_IDS, DTYPES_16
from checks import assert_matches_reference, assert_repeatable, decode_all_ways
from launch_paths import CLUSTER_MERGE, PORTABLE, SM90, launches_during, requires_hopper
from make_inputs import make_problem
from reference import decode_reference

# Full, odd, empty, one key, only the first piece, nearly full (capacity 1024).
LENS = [1024, 517, 0, 1, 65, 1000]


def check(problem, dtype, kv_len_per_split, merged, what):
    (out, lse), launched = launches_during(lambda: decode_all_ways(problem, kv_len_per_split=kv_len_per_split))
    calls = 3  # decode_all_ways calls the op three ways
    assert launched[SM90] == calls and launched[PORTABLE] == 0, f"{what}: launches per path {launched}"
    assert launched[CLUSTER_MERGE] == (calls if merged else 0), f"{what}: launches per path {launched}"
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, what)


@requires_hopper
@pytest.mark.parametrize("num_heads", [24, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_two_pieces_merge_in_clusters(dtype, num_heads, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=LENS, num_heads=num_heads)
    check(problem, dtype, 512, True, f"2 pieces, {num_heads} heads")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_default_split_of_two_pieces_merges(dtype, gen):
    """B = 28, H = 128, S = 1K without seq_lens: the shape-only planner cuts each sequence in two (112 CTAs)."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[1024] * 28, num_heads=128)
    check(problem, dtype, None, True, "default split, B = 28")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_causal_tokens_merge_in_clusters(dtype, gen):
    """S_q = 2, H = 64: two row blocks whose key limits differ by one; the last key of a row may open a piece."""
    lens = [1024, 513, 257, 512, 1]
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=lens, num_heads=64, seqlen_q=2, causal=True)
    check(problem, dtype, 512, True, "causal S_q = 2")


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
    check(problem, dtype, 512, True, f"hidden pages, {cache_layout} cache")


@requires_hopper
@pytest.mark.parametrize("kv_len_per_split", [384, 256, 128, 64], ids=["3_pieces", "4", "8", "16"])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_more_pieces_use_the_combine(dtype, kv_len_per_split, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=LENS, num_heads=128)
    check(problem, dtype, kv_len_per_split, False, f"split {kv_len_per_split}")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_long_pieces_use_the_combine(dtype, gen):
    """Two pieces of 4096 keys: longer than the cluster merge takes (kClusterMergeMaxKeys)."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[8192, 5000, 4097], num_heads=64)
    check(problem, dtype, 4096, False, "two pieces of 4096 keys")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_sm90_cluster_merge_is_deterministic(dtype, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=LENS, num_heads=128)
    assert_repeatable(problem, kv_len_per_split=512)
