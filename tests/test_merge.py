"""merge_states: against the float64 merge, and two halves of a cache merged equal one decode over the whole."""

from __future__ import annotations

import math

import pytest
import torch

import mla_ext
from tests.reference import decode_reference, merge_reference
from tests.support.axes import DTYPE_IDS, DTYPES
from tests.support.checks import assert_matches_reference
from tests.support.make_inputs import make_problem, random_states


@pytest.mark.parametrize("shape", [(3, 16), (2, 3, 24)], ids=["B-H", "B-Sq-H"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_merge_matches_reference(dtype, shape, device, gen):
    out_a, lse_a = random_states(gen, shape, dtype, device)
    out_b, lse_b = random_states(gen, shape, dtype, device)
    out, lse = mla_ext.merge_states(out_a, lse_a, out_b, lse_b)
    ref_out, ref_lse = merge_reference(out_a, lse_a, out_b, lse_b)
    assert torch.isneginf(ref_lse).any() and torch.isfinite(ref_lse).any()  # both kinds of row are exercised
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)
    op_out, op_lse = torch.ops.mla.merge_states(out_a, lse_a, out_b, lse_b)
    assert torch.equal(op_out, out) and torch.equal(op_lse, lse)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_merge_both_empty(dtype, device):
    out_a = torch.zeros(2, 8, 512, dtype=dtype, device=device)
    lse_a = torch.full((2, 8), -math.inf, device=device)
    out, lse = mla_ext.merge_states(out_a, lse_a, out_a.clone(), lse_a.clone())
    assert (out == 0).all() and torch.isneginf(lse).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_two_halves_merge_to_whole(dtype, device, gen):
    """decode_with_lse over keys [0, k) and [k, S) of one dense cache, merged, equals decode over [0, S).

    Lengths put some sequences entirely in the first half, one at 0 keys (both halves empty)."""
    split_at = 208  # a multiple of 16 elements, so the second half's views stay 16-byte aligned
    lens = [500, 208, 150, 0, 209]
    problem = make_problem(gen, device=device, dtype=dtype, lens=lens, num_heads=16, dense_slack=3)
    q, q_pe, kv, k_pe = problem.args()
    lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    first = torch.ops.mla.decode_with_lse(
        q, q_pe, kv[:, :split_at], k_pe[:, :split_at], seq_lens=lens_t.clamp(max=split_at)
    )
    second = torch.ops.mla.decode_with_lse(
        q, q_pe, kv[:, split_at:], k_pe[:, split_at:], seq_lens=(lens_t - split_at).clamp(min=0)
    )
    out, lse = mla_ext.merge_states(*first, *second)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    # Two roundings to dtype (the halves, then the merge): the contract's tolerance still holds.
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DTYPE_IDS.get)
def test_prefix_and_suffix_pages_merge_to_whole(dtype, page_size, causal, device, gen):
    """A paged cache with S_q = 3 query tokens (multi-token decode): its first pages (a shared prefix) and the rest,
    decoded apart with decode_with_lse and merged, equal one decode over all pages.

    Causal: every token sees the whole prefix, so the prefix is decoded without the mask and the suffix with it;
    the lengths are 0 or at least prefix + S_q - 1 (else the prefix itself would need the mask)."""
    seqlen_q, prefix_pages = 3, 2
    split_at = prefix_pages * page_size
    if causal:
        lens = [2 * split_at + 37, 0, split_at + seqlen_q - 1, split_at + 50]
    else:
        lens = [2 * split_at + 37, 0, 5, split_at, split_at + 1]
    problem = make_problem(
        gen, device=device, dtype=dtype, lens=lens, num_heads=16, seqlen_q=seqlen_q, causal=causal, page_size=page_size
    )
    q, q_pe, kv, k_pe = problem.args()
    table, seq_lens = problem.block_table, problem.seq_lens
    prefix = torch.ops.mla.decode_with_lse(
        q, q_pe, kv, k_pe, block_table=table[:, :prefix_pages], seq_lens=seq_lens.clamp(max=split_at)
    )
    suffix = torch.ops.mla.decode_with_lse(
        q, q_pe, kv, k_pe, block_table=table[:, prefix_pages:], seq_lens=(seq_lens - split_at).clamp(min=0),
        causal=causal,
    )  # fmt: skip
    out, lse = mla_ext.merge_states(*prefix, *suffix)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize(
    "broken, message",
    [
        ("out_b-shape", r"\bout_b\b"),
        ("lse_b-shape", r"\blse_b\b"),
        ("out_b-dtype", r"\bout_b\b"),
        ("lse_a-dtype", r"\blse_a\b"),
        ("outs-float64", r"\bout_a\b"),
    ],
)
def test_merge_bad_input_names_the_argument(broken, message):
    out = torch.randn(2, 8, 512, dtype=torch.bfloat16)
    lse = torch.randn(2, 8)
    args = {"out_a": out, "lse_a": lse, "out_b": out.clone(), "lse_b": lse.clone()}
    args.update(
        {
            "out_b-shape": {"out_b": out[:, :4]},
            "lse_b-shape": {"lse_b": lse[:1]},
            "out_b-dtype": {"out_b": out.half()},
            "lse_a-dtype": {"lse_a": lse.double()},
            "outs-float64": {"out_a": out.double(), "out_b": out.double()},
        }[broken]
    )
    with pytest.raises((RuntimeError, ValueError), match=message):
        torch.ops.mla.merge_states(args["out_a"], args["lse_a"], args["out_b"], args["lse_b"])


def test_merge_strided_inputs_are_read_correctly_or_refused(device, gen):
    """Partial states are often views (a slice of a bigger buffer): merge reads them right, or names the view."""
    out_a, lse_a = random_states(gen, (3, 16), torch.bfloat16, device)
    out_b, lse_b = random_states(gen, (3, 16), torch.bfloat16, device)
    wide = torch.full((16, 3, 1024), float("nan"), dtype=torch.bfloat16, device=device)
    wide[..., ::2] = out_a.transpose(0, 1)
    strided_a = wide.transpose(0, 1)[..., ::2]  # [3, 16, 512], no dim contiguous
    try:
        out, lse = mla_ext.merge_states(strided_a, lse_a, out_b, lse_b)
    except (RuntimeError, ValueError) as error:
        assert "out_a" in str(error)
        return
    ref_out, ref_lse = merge_reference(out_a, lse_a, out_b, lse_b)
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16)
