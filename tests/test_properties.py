"""Serving properties: bitwise determinism, batch invariance, split invariance, large caches, and values that
cannot be checked without a host sync, which are clamped or hidden by default (strict mode: tests/test_strict.py)."""

from __future__ import annotations

import pytest
import torch

import mla_ext
from tests.reference import decode_reference
from tests.support.axes import DTYPE_IDS, requires_cuda
from tests.support.checks import OUT_RTOL, assert_matches_reference, assert_repeatable, relative_error
from tests.support.make_inputs import empty_outputs_like, make_problem, randn


def long_problem(gen, device, dtype, page_size=16):
    return make_problem(
        gen,
        device=device,
        dtype=dtype,
        lens=[1000, 0, 333, 17, 640],
        num_heads=32,
        seqlen_q=2,
        causal=True,
        page_size=page_size,
        dense_slack=5,
    )


@pytest.mark.parametrize("kv_len_per_split", [None, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DTYPE_IDS.get)
def test_bitwise_deterministic(dtype, kv_len_per_split, device, gen):
    assert_repeatable(long_problem(gen, device, dtype), kv_len_per_split=kv_len_per_split)


@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "paged"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DTYPE_IDS.get)
def test_batch_invariant(dtype, page_size, device, gen):
    """With a fixed kv_len_per_split, each sequence's result alone equals its result inside the batch, bit for bit."""
    problem = long_problem(gen, device, dtype, page_size)
    kwargs = dict(kv_len_per_split=128, causal=True)
    batch_out, batch_lse = mla_ext.decode(
        *problem.args(), return_lse=True, block_table=problem.block_table, seq_lens=problem.seq_lens, **kwargs
    )
    for b in range(problem.q.shape[0]):
        one = slice(b, b + 1)
        kv, k_pe = (problem.kv, problem.k_pe) if page_size else (problem.kv[one], problem.k_pe[one])
        out, lse = mla_ext.decode(
            problem.q[one],
            problem.q_pe[one],
            kv,
            k_pe,
            return_lse=True,
            **kwargs,
            block_table=None if problem.block_table is None else problem.block_table[one],
            seq_lens=None if problem.seq_lens is None else problem.seq_lens[one],
        )
        assert torch.equal(out, batch_out[one]), f"sequence {b} alone differs from sequence {b} in the batch"
        assert torch.equal(lse, batch_lse[one])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=DTYPE_IDS.get)
def test_split_invariant(dtype, device, gen):
    """Any kv_len_per_split gives the reference's answer; in fp32 the splits agree to fp32 rounding."""
    problem = long_problem(gen, device, dtype)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    results = {}
    for kv_len_per_split in [16, 48, 128, 1024, 4096, None]:
        out, lse = mla_ext.decode(*problem.args(), return_lse=True, **problem.kwargs(kv_len_per_split=kv_len_per_split))
        assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"kv_len_per_split={kv_len_per_split}")
        results[kv_len_per_split] = out
    if dtype == torch.float32:
        for split, out in results.items():
            err = relative_error(out, results[16])
            assert err <= OUT_RTOL[dtype], f"split {split} vs 16: {err:.3g}"


def test_offsets_beyond_int32(device, gen):
    """Pages past element 2**31 of a fp16 cache (4.3 GB, mostly never touched) are addressed correctly."""
    page_size, num_pages = 64, 58_300  # num_pages * page_size * 576 > 2**31
    assert num_pages * page_size * 576 > 2**31
    cache = torch.empty(num_pages, page_size, 576, dtype=torch.float16, device=device)
    pages = torch.tensor([[num_pages - 1, 1, num_pages - 7], [num_pages - 3, num_pages - 2, 0]], dtype=torch.int32)
    for page in pages.flatten().tolist():
        cache[page] = torch.randn(page_size, 576, generator=gen).half().to(device)
    problem = make_problem(gen, device=device, dtype=torch.float16, lens=[1, 1], num_heads=16)
    problem.kv, problem.k_pe = cache[..., :512], cache[..., 512:]
    problem.block_table = pages.to(device)
    problem.seq_lens = torch.tensor([150, 192], dtype=torch.int32, device=device)
    out, lse = mla_ext.decode(*problem.args(), return_lse=True, **problem.kwargs(kv_len_per_split=64))
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float16)


def invalid_values_problem(gen, device, page_size):
    """Sequences 0 and 2 fill their capacity; then seq_lens[0] is set above capacity, seq_lens[1] negative and
    (paged) block_table[2, 1] out of range. Unchecked, these mean: clamp to capacity, no key, page invisible."""
    lens = [64, 30, 64, 10]
    problem = make_problem(
        gen,
        device=device,
        dtype=torch.float32,
        lens=lens,
        num_heads=8,
        page_size=page_size,
        spare_slots=0,
        dense_seq_lens=True,
    )
    problem.seq_lens[0] = 100_000
    problem.seq_lens[1] = -7
    if page_size:
        problem.block_table[2, 1] = problem.kv.shape[0] + 100
    return problem


@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "paged"])
def test_invalid_values_are_clamped_by_default(page_size, device, gen):
    problem = invalid_values_problem(gen, device, page_size)
    out, lse = mla_ext.decode(*problem.args(), return_lse=True, **problem.kwargs(kv_len_per_split=32))
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float32)


@pytest.mark.parametrize("page_size", [None, 1, 16], ids=["dense", "page1", "page16"])
def test_hostile_values_are_clamped_or_invisible(page_size, device, gen):
    """Without strict mode, lengths beyond the capacity clamp to it, negative ones to 0, and table entries outside
    [0, P) inside the used pages hide their keys: exactly the reference's reading, never an out-of-bounds access."""
    capacity = 48
    problem = make_problem(
        gen,
        device=device,
        dtype=torch.float32,
        lens=[capacity] * 4,
        num_heads=8,
        page_size=page_size,
        dense_seq_lens=True,
        spare_slots=0,
    )
    int32_max = 2**31 - 1
    problem.seq_lens.copy_(torch.tensor([int32_max, -7, capacity - 3, 1], dtype=torch.int32))
    if page_size:
        problem.block_table[2, 1] = -1  # a hole inside sequence 2's used pages
        problem.block_table[3, 0] = int32_max  # sequence 3's only used page is out of range: no visible key
    out, lse = empty_outputs_like(problem.q)
    mla_ext.decode(*problem.args(), **problem.kwargs(kv_len_per_split=16), out=out, lse=lse)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float32, "hostile values")


# A cache row is 576 elements: this many keys put a cache (and its last 100 rows) past element 2**31.
KEYS_PAST_INT32 = 2**31 // 576 + 256


@pytest.mark.parametrize("kv_len_per_split", [2**20, None], ids=["split1M", "split-auto"])
def test_offsets_beyond_int32_dense_batch_stride(kv_len_per_split, device, gen):
    """A dense fp16 cache [2, S_kv, 576] with S_kv * 576 > 2**31 (8.6 GB, mostly never touched): sequence 1 starts
    past element 2**31, so its batch offset needs 64 bits."""
    if device == "cpu" and kv_len_per_split is None:
        pytest.skip("the CPU default split over a 3.7M-key capacity allocates large partials; one split size is enough")
    cache = torch.empty(2, KEYS_PAST_INT32, 576, dtype=torch.float16, device=device)
    lens = [100, 150]
    for b, length in enumerate(lens):
        cache[b, :length] = randn(gen, (length, 576), torch.float16, device)
    problem = make_problem(gen, device=device, dtype=torch.float16, lens=[1, 1], num_heads=16)
    problem.kv, problem.k_pe = cache[..., :512], cache[..., 512:]
    problem.seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out, lse = mla_ext.decode(*problem.args(), return_lse=True, **problem.kwargs(kv_len_per_split=kv_len_per_split))
    compact = cache[:, : max(lens)]  # the reference widens what it is given to float64: give it the used rows only
    ref_out, ref_lse = decode_reference(
        problem.q, problem.q_pe, compact[..., :512], compact[..., 512:], seq_lens=problem.seq_lens
    )
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float16)


def test_offsets_beyond_int32_page_size_1(device, gen):
    """One key per page (SGLang's layout) in a 4.3 GB fp16 cache: sequence 0 reads the last pages backwards,
    sequence 1 alternates between the first pages and pages past element 2**31."""
    num_pages = KEYS_PAST_INT32
    cache = torch.empty(num_pages, 1, 576, dtype=torch.float16, device=device)
    lens = [70, 45]
    table = torch.full((2, 70), -1, dtype=torch.int32)
    table[0] = torch.arange(num_pages - 1, num_pages - 71, -1, dtype=torch.int32)
    table[1, :45] = torch.tensor([i if i % 2 else num_pages - 80 - i for i in range(45)], dtype=torch.int32)
    for page in table[table >= 0].tolist():
        cache[page] = randn(gen, (1, 576), torch.float16, device)
    problem = make_problem(gen, device=device, dtype=torch.float16, lens=[1, 1], num_heads=16, seqlen_q=2)
    problem.kv, problem.k_pe = cache[..., :512], cache[..., 512:]
    problem.block_table = table.to(device)
    problem.seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out, lse = mla_ext.decode(*problem.args(), return_lse=True, **problem.kwargs(kv_len_per_split=32))
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float16)


@requires_cuda
@pytest.mark.parametrize("kv_len_per_split", [None, 2**16], ids=["split-auto", "split64K"])
def test_offsets_beyond_int32_within_one_sequence(kv_len_per_split, gen):
    """One sequence of 3.7M keys (4.3 GB bf16), every key visible: its own key offsets pass 2**31. All keys are 0
    (score 0, value 0) except a few random ones at the start, the middle and past element 2**31, so the expected
    result is the reference over those few, merged with N zero keys in closed form: lse = logaddexp(lse_few,
    log N), out = out_few * exp(lse_few - lse)."""
    capacity = KEYS_PAST_INT32
    special = [0, 5, capacity // 2, capacity - 100, capacity - 1]
    assert (capacity - 100) * 576 > 2**31
    cache = torch.zeros(1, capacity, 576, dtype=torch.bfloat16, device="cuda")
    few = randn(gen, (1, len(special), 576), torch.bfloat16, "cuda")
    cache[:, special] = few
    problem = make_problem(gen, device="cuda", dtype=torch.bfloat16, lens=[1], num_heads=16)
    out, lse = mla_ext.decode(
        problem.q, problem.q_pe, cache[..., :512], cache[..., 512:], return_lse=True, kv_len_per_split=kv_len_per_split
    )
    few_out, few_lse = decode_reference(problem.q, problem.q_pe, few[..., :512], few[..., 512:])
    zeros = torch.tensor(float(capacity - len(special)), dtype=torch.float64).log()
    ref_lse = torch.logaddexp(few_lse, zeros)
    ref_out = few_out * torch.exp(few_lse - ref_lse)[..., None]
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16)
