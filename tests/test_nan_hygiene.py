"""NaN and inf hygiene: non-finite values in cache slots a row does not see never change its output, -inf scores
weigh exactly 0, and rows whose every score is -inf read as rows with no key. Non-finite values in keys a row
does see make that row non-finite (they are never silently dropped)."""

from __future__ import annotations

import math

import pytest
import torch

import mla_ext
from tests.reference import decode_reference
from tests.support.axes import DTYPE_IDS, DTYPES
from tests.support.checks import assert_matches_reference
from tests.support.make_inputs import empty_outputs_like, make_problem, randn, random_states

POISONS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def decode_into_poisoned(problem, **options):
    """decode_out into NaN-filled out/lse, so an element the kernel skips stays NaN."""
    out, lse = empty_outputs_like(problem.q)
    mla_ext.decode(*problem.args(), **problem.kwargs(**options), out=out, lse=lse)
    return out, lse


def unused_rows(problem):
    """[P or B, rows] bool: the cache rows make_problem poisoned (rows beyond seq_len, page tails, spare pages)."""
    return ~(torch.isfinite(problem.kv).all(-1) & torch.isfinite(problem.k_pe).all(-1))


def check_unused_slots_never_matter(gen, device, dtype, page_size, kv_len_per_split, num_heads):
    problem = make_problem(
        gen,
        device=device,
        dtype=dtype,
        lens=[70, 0, 1, 33, 16],
        num_heads=num_heads,
        seqlen_q=2,
        causal=True,
        page_size=page_size,
        dense_slack=9,
        spare_slots=2,
    )
    unused = unused_rows(problem)
    assert unused.any()
    count = int(unused.sum())
    problem.kv[unused] = randn(gen, (count, problem.kv.shape[-1]), dtype, device)
    problem.k_pe[unused] = randn(gen, (count, problem.k_pe.shape[-1]), dtype, device)
    expected_out, expected_lse = decode_into_poisoned(problem, kv_len_per_split=kv_len_per_split)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(expected_out, expected_lse, ref_out, ref_lse, dtype, "random unused slots")
    for name, value in POISONS.items():
        problem.kv[unused] = value
        problem.k_pe[unused] = value
        out, lse = decode_into_poisoned(problem, kv_len_per_split=kv_len_per_split)
        assert torch.equal(out, expected_out), f"{name} in unused slots changed out"
        assert torch.equal(lse, expected_lse), f"{name} in unused slots changed lse"


@pytest.mark.parametrize("kv_len_per_split", [None, 16])
@pytest.mark.parametrize("page_size", [None, 1, 16], ids=["dense", "page1", "page16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_unused_slot_contents_never_matter(dtype, page_size, kv_len_per_split, device, gen):
    """The result is bitwise the same whether unused slots hold random numbers, NaN, +inf or -inf."""
    check_unused_slots_never_matter(gen, device, dtype, page_size, kv_len_per_split, num_heads=16)


@pytest.mark.parametrize("kv_len_per_split", [None, 16])
@pytest.mark.parametrize("page_size", [None, 64], ids=["dense", "page64"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
def test_unused_slot_contents_never_matter_many_heads(dtype, page_size, kv_len_per_split, device, gen):
    """The same with 128 heads x 2 tokens: the 64-row tensor-core kernels (and Hopper's own kernel where built)."""
    check_unused_slots_never_matter(gen, device, dtype, page_size, kv_len_per_split, num_heads=128)


def signed_rope_problem(gen, device, dtype, num_heads=4, lens=(40, 25)):
    """A dense problem whose q_pe[..., 3] is +1 on even heads and -1 on odd ones, so an inf in k_pe[b, j, 3]
    gives key j a score of +inf on even heads and -inf on odd ones (and never the NaN of 0 * inf)."""
    problem = make_problem(gen, device=device, dtype=dtype, lens=list(lens), num_heads=num_heads, dense_seq_lens=True)
    signs = torch.tensor([1.0 if h % 2 == 0 else -1.0 for h in range(num_heads)], dtype=dtype, device=device)
    problem.q_pe[..., 3] = signs
    return problem


@pytest.mark.parametrize("kv_len_per_split", [None, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_neg_inf_score_weighs_zero(dtype, kv_len_per_split, device, gen):
    """A used key whose score is -inf (inf in its rotary part, negative query) gets weight exactly 0: the odd heads
    match the reference, which drops that key the same way (its latent part, the value, stays finite)."""
    problem = signed_rope_problem(gen, device, dtype)
    problem.k_pe[0, 7, 3] = math.inf
    problem.k_pe[1, 24, 3] = math.inf  # the last used key
    out, lse = decode_into_poisoned(problem, kv_len_per_split=kv_len_per_split)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    odd = slice(1, None, 2)
    assert_matches_reference(out[:, odd], lse[:, odd], ref_out[:, odd], ref_lse[:, odd], dtype, "-inf score heads")


@pytest.mark.parametrize("kv_len_per_split", [None, 16])
@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "paged"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_all_scores_neg_inf_read_as_no_key(dtype, page_size, kv_len_per_split, device, gen):
    """When every visible key of a row scores -inf the row has no weight anywhere: out 0 and lse -inf exactly, as
    for a row with no key; a sequence with ordinary keys next to it is unaffected."""
    problem = make_problem(
        gen, device=device, dtype=dtype, lens=[50, 37], num_heads=8, page_size=page_size, dense_seq_lens=True
    )
    problem.q_pe[..., 3] = -1.0
    if page_size:  # every key of sequence 0 scores -inf on every head
        for page in problem.block_table[0, : math.ceil(50 / page_size)].tolist():
            problem.k_pe[page, :, 3] = math.inf
    else:
        problem.k_pe[0, :50, 3] = math.inf
    out, lse = decode_into_poisoned(problem, kv_len_per_split=kv_len_per_split)
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all(), "all -inf scores must give out 0, lse -inf"
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, "all -inf scores")


def test_merge_states_never_reads_an_empty_side(device, gen):
    """merge_states: a side with lse -inf weighs 0 and is selected away, so NaN/inf in its out cannot leak; both
    sides empty give out 0, lse -inf."""
    out_a, lse_a = random_states(gen, (4, 16), torch.bfloat16, device)
    out_b, lse_b = random_states(gen, (4, 16), torch.bfloat16, device)
    lse_b[0] = -math.inf  # row 0: both sides may be empty; row 1: only b
    lse_a[0, :4] = -math.inf
    lse_b[1] = -math.inf
    expected_out, expected_lse = mla_ext.merge_states(out_a, lse_a, out_b, lse_b)
    for value in POISONS.values():
        poisoned_a, poisoned_b = out_a.clone(), out_b.clone()
        poisoned_a[torch.isneginf(lse_a)] = value
        poisoned_b[torch.isneginf(lse_b)] = value
        out, lse = mla_ext.merge_states(poisoned_a, lse_a, poisoned_b, lse_b)
        assert torch.equal(out, expected_out) and torch.equal(lse, expected_lse)
    assert (expected_out[0, :4] == 0).all() and torch.isneginf(expected_lse[0, :4]).all()
    assert torch.isfinite(expected_out).all()


@pytest.mark.parametrize("kv_len_per_split", [16, None])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DTYPE_IDS.get)
def test_stale_split_buffers_are_never_read(dtype, kv_len_per_split, device, gen):
    """Many splits, most of them empty (short sequences in a long cache; or the default split, which may size work
    items from seq_lens and leave spare ones): the split partials come from memory that last held NaN, and an empty
    split writes only its lse, so the combine must select those splits away."""
    if device == "cuda":  # hand the caching allocator blocks full of NaN for the partials to land in
        stale = [torch.full((n,), math.nan, device=device) for n in (1 << 20, 1 << 22, 1 << 24)]
        del stale
    problem = make_problem(
        gen, device=device, dtype=dtype, lens=[3, 0, 700, 17], num_heads=16, dense_slack=300, dense_seq_lens=True
    )
    out, lse = decode_into_poisoned(problem, kv_len_per_split=kv_len_per_split)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, "stale split buffers")


@pytest.mark.parametrize("kv_len_per_split", [None, 16])
@pytest.mark.parametrize("bad", ["nan-latent", "inf-rope"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_nonfinite_used_key_makes_its_rows_nonfinite(dtype, bad, kv_len_per_split, device, gen):
    """NaN in a used key's latent part makes every score (and the value) NaN; +inf in its rotary part scores +inf on
    the even heads. Those rows must come out non-finite, as the float64 reference's do (NaN out and lse for NaN;
    +-inf out and lse +inf for a +inf score); the other sequence matches the reference as usual."""
    problem = signed_rope_problem(gen, device, dtype)
    if bad == "nan-latent":
        problem.kv[0, 7, 100] = math.nan
        rows = slice(None)
    else:
        problem.k_pe[0, 7, 3] = math.inf
        rows = slice(0, None, 2)
    out, lse = decode_into_poisoned(problem, kv_len_per_split=kv_len_per_split)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert not torch.isfinite(ref_out[0, rows]).any() and not torch.isfinite(ref_lse[0, rows]).any()
    assert_matches_reference(out[1:], lse[1:], ref_out[1:], ref_lse[1:], dtype, "the clean sequence")
    assert not torch.isfinite(out[0, rows]).any(), f"{bad}: rows that see the key must be non-finite: {out[0, 0, :4]}"
    assert not torch.isfinite(lse[0, rows]).any(), f"{bad}: lse of rows that see the key: {lse[0, rows].tolist()}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_merge_states_keeps_nan(dtype, device, gen):
    """A partial state that saw a non-finite key (lse NaN) makes the merged row NaN, as merging in float64 would;
    a max that ignores NaN would silently return the other side."""
    out_a, lse_a = randn(gen, (3, 512), dtype, device), randn(gen, (3,), torch.float32, device)
    out_b, lse_b = randn(gen, (3, 512), dtype, device), randn(gen, (3,), torch.float32, device)
    lse_a[1] = math.nan
    out_a[1] = math.nan
    lse_b[2] = math.nan
    out, lse = mla_ext.merge_states(out_a, lse_a, out_b, lse_b)
    assert torch.isnan(lse[1:]).all() and torch.isnan(out[1:]).all()
    assert torch.isfinite(lse[0]) and torch.isfinite(out[0]).all()
