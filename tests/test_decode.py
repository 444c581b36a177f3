"""Correctness against the float64 reference across the axes of the contract (pairwise), plus the seed's own call."""

from __future__ import annotations

import pytest
import torch

import mla_ext
from tests.reference import decode_reference
from tests.support.axes import DTYPE_IDS, DTYPES
from tests.support.checks import assert_matches_reference, decode_all_ways, relative_error
from tests.support.make_inputs import make_problem, varlen_lens
from tests.support.pairwise import all_pairs

# Every value meets every other axis's every value at least once; cheap values first (ties pick them).
AXES = {
    "dtype": DTYPES,
    "page_size": [None, 1, 16, 64, 128],  # None: dense cache
    "num_heads": [1, 8, 16, 24, 32, 128],
    "query": [(1, False), (1, True), (2, False), (2, True), (4, True)],  # (S_q, causal)
    "max_len": [17, 129, 1000],
    "varlen": [False, True],  # True: lengths [max_len, 0, 1, random] and poisoned slack rows
    "kv_len_per_split": [None, 16, 48, 128, 512],
    "cache_layout": ["separate", "fused"],
    "q_layout": ["contiguous", "transposed", "fused"],
}
CASES = all_pairs(AXES)


def case_id(case):
    seqlen_q, causal = case["query"]
    layout = "dense" if case["page_size"] is None else f"page{case['page_size']}"
    return "-".join(
        [
            DTYPE_IDS[case["dtype"]],
            layout,
            f"H{case['num_heads']}",
            f"Sq{seqlen_q}{'causal' if causal else ''}",
            f"L{case['max_len']}",
            "varlen" if case["varlen"] else "full",
            f"split{case['kv_len_per_split'] or 'auto'}",
            f"cache-{case['cache_layout']}",
            f"q-{case['q_layout']}",
        ]
    )


@pytest.mark.parametrize("case", CASES, ids=[case_id(case) for case in CASES])
def test_matches_reference(case, device, gen):
    seqlen_q, causal = case["query"]
    lens = varlen_lens(gen, 4, case["max_len"]) if case["varlen"] else [case["max_len"]] * 2
    problem = make_problem(
        gen,
        device=device,
        dtype=case["dtype"],
        lens=lens,
        num_heads=case["num_heads"],
        seqlen_q=seqlen_q,
        causal=causal,
        page_size=case["page_size"],
        cache_layout=case["cache_layout"],
        q_layout=case["q_layout"],
        dense_slack=7 if case["varlen"] else 0,
    )
    out, lse = decode_all_ways(problem, kv_len_per_split=case["kv_len_per_split"])
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, case["dtype"])


@pytest.mark.parametrize("kv_len_per_split", [None, 256])
@pytest.mark.parametrize("page_size", [None, 64], ids=["dense", "page64"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DTYPE_IDS.get)
def test_long_sequences(dtype, page_size, kv_len_per_split, device, gen):
    """Thousands of keys: many splits to combine, next to a one-key and an empty sequence."""
    problem = make_problem(
        gen, device=device, dtype=dtype, lens=[5000, 1, 4099, 0], num_heads=16, page_size=page_size, dense_slack=9
    )
    out, lse = decode_all_ways(problem, kv_len_per_split=kv_len_per_split)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("kv_len_per_split", [None, 4096])
def test_fp32_long_run_of_equal_keys(kv_len_per_split, device, gen):
    """fp32 to 1e-5 where rounding piles up most: 1811 equal keys (every score and value the same) after 237 random
    ones, also in one split of all 2048 keys (the longest running sum)."""
    problem = make_problem(gen, device=device, dtype=torch.float32, lens=[2048], num_heads=16)
    problem.kv[0, 237:] = 0.5
    problem.k_pe[0, 237:] = 0.5
    out, lse = decode_all_ways(problem, kv_len_per_split=kv_len_per_split)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float32)


@pytest.mark.parametrize("kv_len_per_split", [None, 128, 512])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_seed_call(dtype, kv_len_per_split, device, gen):
    """The seed's call: dense contiguous [B, S, 512] / [B, S, 64] caches, q [B, H, 512], default sm_scale."""
    problem = make_problem(gen, device=device, dtype=dtype, lens=[1024] * 3, num_heads=16)
    if kv_len_per_split is None:
        out = torch.ops.mla.decode(*problem.args())
    else:
        out = torch.ops.mla.decode(*problem.args(), kv_len_per_split=kv_len_per_split)
    ref_out, _ = decode_reference(*problem.args(), sm_scale=576**-0.5)
    assert out.shape == (3, 16, 512)
    assert_matches_reference(out, None, ref_out, None, dtype)


@pytest.mark.parametrize("sm_scale", [0.02, 0.1])  # about 0.5x and 2.4x the default; lse stays below ~20
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_explicit_sm_scale(dtype, sm_scale, device, gen):
    problem = make_problem(gen, device=device, dtype=dtype, lens=[300, 5], num_heads=8, page_size=16)
    out, lse = decode_all_ways(problem, sm_scale=sm_scale, kv_len_per_split=64)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs(sm_scale=sm_scale))
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_scores_beyond_exp_range(dtype, device, gen):
    """Every score shifted by +100 (exp would overflow fp32 without a running max): out is unchanged by the shift.

    The shift comes from one rope channel set to 1 in every key, against a query value of 100 / sm_scale there.
    fp32 itself resolves a score near 100 only to ~1e-5 (and the unscaled dot near 2400 to ~2e-4), so this
    ill-conditioned problem is held to 1e-4 (out, relative) and 1e-6 (lse, relative) in fp32; 16-bit inputs keep
    the usual tolerances, which their own rounding dominates."""
    problem = make_problem(gen, device=device, dtype=dtype, lens=[700, 33], num_heads=16, page_size=64)
    problem.k_pe[..., 0] = 1.0
    problem.q_pe[..., 0] = 100 * 24.0  # sm_scale = 1 / 24
    out, lse = decode_all_ways(problem, kv_len_per_split=128)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert (ref_lse > 100).all()
    if dtype == torch.float32:
        for b in range(out.shape[0]):
            assert relative_error(out[b], ref_out[b]) <= 1e-4
        lse_rtol = 1e-6
    else:
        assert_matches_reference(out, None, ref_out, ref_lse, dtype)
        lse_rtol = 1e-5
    assert ((lse.double().cpu() - ref_lse) / ref_lse).abs().max().item() <= lse_rtol


def test_four_dim_single_token_equals_three_dim(device, gen):
    """q [B, 1, H, D] gives out [B, 1, H, D] equal to the [B, H, D] form of the same data."""
    problem = make_problem(gen, device=device, dtype=torch.bfloat16, lens=[200, 77], num_heads=8, page_size=16)
    out3, lse3 = mla_ext.decode(*problem.args(), return_lse=True, **problem.kwargs(kv_len_per_split=64))
    q4, q_pe4 = problem.q.unsqueeze(1), problem.q_pe.unsqueeze(1)
    out4, lse4 = mla_ext.decode(
        q4, q_pe4, problem.kv, problem.k_pe, return_lse=True, **problem.kwargs(kv_len_per_split=64)
    )
    assert out4.shape == (2, 1, 8, 512) and lse4.shape == (2, 1, 8)
    assert torch.equal(out4[:, 0], out3) and torch.equal(lse4[:, 0], lse3)


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_empty_batch(paged, device, gen):
    """B = 0 returns empty out [0, H, D] and lse [0, H] (and decode_out accepts empty outputs)."""
    problem = make_problem(
        gen, device=device, dtype=torch.float16, lens=[], num_heads=16, page_size=16 if paged else None
    )
    if not paged:  # an empty dense cache of some capacity
        problem.kv = torch.randn(0, 64, 512, device=device).half()
        problem.k_pe = torch.randn(0, 64, 64, device=device).half()
    out, lse = decode_all_ways(problem)
    assert out.shape == (0, 16, 512) and out.dtype == torch.float16
    assert lse.shape == (0, 16) and lse.dtype == torch.float32


@pytest.mark.parametrize("seqlen_q, causal", [(1, False), (2, True)])
@pytest.mark.parametrize("kv_len_per_split", [None, 16])
def test_zero_length_dense_cache(seqlen_q, causal, kv_len_per_split, device, gen):
    """S_kv = 0: every row sees no key, so out is exactly 0 and lse -inf."""
    problem = make_problem(gen, device=device, dtype=torch.bfloat16, lens=[0, 0, 0], num_heads=24, seqlen_q=seqlen_q)
    problem.causal = causal
    assert problem.kv.shape == (3, 0, 512)
    out, lse = decode_all_ways(problem, kv_len_per_split=kv_len_per_split)
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_wrapper_writes_into_given_outputs(device, gen):
    """mla_ext.decode(out=, lse=) fills and returns the caller's tensors."""
    problem = make_problem(gen, device=device, dtype=torch.float16, lens=[90, 0, 3], num_heads=16, seqlen_q=2)
    problem.causal = True
    out = torch.full((3, 2, 16, 512), float("nan"), dtype=torch.float16, device=device)
    lse = torch.full((3, 2, 16), float("nan"), device=device)
    got_out, got_lse = mla_ext.decode(*problem.args(), **problem.kwargs(), return_lse=True, out=out, lse=lse)
    assert got_out.data_ptr() == out.data_ptr() and got_lse.data_ptr() == lse.data_ptr()
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float16)
    only_out = mla_ext.decode(*problem.args(), **problem.kwargs(), out=torch.empty_like(out))
    assert torch.equal(only_out, out)
