"""The few-rows CUDA kernel (H * S_q <= 16, fp16/bf16) in its one-CTA-per-SM configuration, which Hopper runs
when the grid leaves SMs free (every call below but the wide-grid one: at most a few dozen CTAs; elsewhere the
kernel's other configurations run the same cases): deep prefetch over 32-key tiles. Tile counts per CTA from 0 to
32, partial last tiles, hidden pages at even and odd tiles, a split or sequence that sees no key, causal S_q = 2;
caches are poisoned beyond every sequence's length."""

from __future__ import annotations

import pytest

from tests.reference import decode_reference
from tests.support.axes import DTYPE_IDS, DTYPES_16, requires_cuda
from tests.support.checks import assert_matches_reference, assert_repeatable, decode_all_ways
from tests.support.make_inputs import make_problem


def check(problem, dtype, what, **options):
    out, lse = decode_all_ways(problem, **options)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, what)


@requires_cuda
@pytest.mark.parametrize("split", [4096, 96, 160, None], ids=["one_split", "split96", "split160", "auto"])
@pytest.mark.parametrize("num_heads", [1, 16])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_tile_counts(dtype, num_heads, split, gen):
    """1, 2, 3, 5, 7 and 32 tiles per sequence, a partial tile of one key, an empty sequence."""
    lens = [32, 64, 96, 160, 224, 1000, 0, 33]
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=lens, num_heads=num_heads, dense_slack=7)
    check(problem, dtype, f"tile counts, split {split}", kv_len_per_split=split)


@requires_cuda
@pytest.mark.parametrize("split", [4096, 128], ids=["one_split", "split128"])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_hidden_pages(dtype, split, gen):
    """32-key pages: each hidden page is one tile (first, adjacent, middle, last; the second sequence's odd tiles),
    the third sequence sees no key at all."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[640, 130, 64], num_heads=16, page_size=32)
    for b, page in [(0, 0), (0, 1), (0, 4), (0, 9), (0, 19), (1, 1), (1, 3), (2, 0), (2, 1)]:
        problem.block_table[b, page] = -1
    check(problem, dtype, "hidden pages", kv_len_per_split=split)


@requires_cuda
@pytest.mark.parametrize("split", [32, 64], ids=["split32", "split64"])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_hidden_pages_wide_grid(dtype, split, gen):
    """The hidden pages above in a grid too wide for one CTA per SM (12 more sequences: 134 or more CTAs, two per SM).
    With 64-key splits each CTA's second tile lies on one page and is copied with one lookup (the first, the
    pipeline's start, goes key by key): a hidden page's tile must still arrive zero-filled and invisible."""
    lens = [640, 130, 64] + [640] * 12
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=lens, num_heads=16, page_size=32)
    for b, page in [(0, 0), (0, 1), (0, 4), (0, 9), (0, 19), (1, 1), (1, 3), (2, 0), (2, 1), (14, 7)]:
        problem.block_table[b, page] = -1
    check(problem, dtype, "hidden pages, wide grid", kv_len_per_split=split)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_causal_two_tokens(dtype, gen):
    """S_q = 2, H = 8: 16 rows whose key limits differ by one, at tile boundaries and inside tiles."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[65, 96, 97, 1], num_heads=8, seqlen_q=2, causal=True)
    check(problem, dtype, "causal S_q = 2", kv_len_per_split=4096)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_deterministic(dtype, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[1000, 517], num_heads=16, page_size=64)
    assert_repeatable(problem, kv_len_per_split=224)
