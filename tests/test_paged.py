"""Paged-cache specifics: odd page sizes, the same data dense vs paged, strided block tables, shared pages."""

from __future__ import annotations

import pytest
import torch

from tests.reference import decode_reference
from tests.support.axes import DTYPE_IDS, DTYPES
from tests.support.checks import assert_matches_reference, decode_all_ways
from tests.support.make_inputs import make_dense_cache, make_problem, make_queries


@pytest.mark.parametrize("page_size", [3, 17, 100])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_odd_page_sizes(dtype, page_size, device, gen):
    """Any page_size >= 1 works, including ones that split the kernel's key tiles unevenly."""
    problem = make_problem(
        gen,
        device=device,
        dtype=dtype,
        lens=[250, 0, 1, 101],
        num_heads=16,
        seqlen_q=2,
        causal=True,
        page_size=page_size,
    )
    out, lse = decode_all_ways(problem, kv_len_per_split=32)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_paged_matches_dense_of_same_keys(page_size, device, gen):
    """The same keys as a dense cache and scattered over shuffled pages give the same answer."""
    lens = [300, 129, 64]
    q, q_pe = make_queries(gen, len(lens), 1, 8, torch.float32, device)
    kv, k_pe = make_dense_cache(gen, lens, max(lens), torch.float32, device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    dense = torch.ops.mla.decode(q, q_pe, kv, k_pe, kv_len_per_split=128, seq_lens=seq_lens)

    pages_per_seq = -(-max(lens) // page_size)
    order = torch.randperm(len(lens) * pages_per_seq, generator=gen)  # page id of (b, i) is order[b * n + i]
    paged_kv = torch.empty(len(lens) * pages_per_seq, page_size, 512, device=device)
    paged_k_pe = torch.empty(len(lens) * pages_per_seq, page_size, 64, device=device)
    padded = pages_per_seq * page_size
    src_kv = torch.nn.functional.pad(kv, (0, 0, 0, padded - kv.shape[1]), value=float("nan"))
    src_k_pe = torch.nn.functional.pad(k_pe, (0, 0, 0, padded - k_pe.shape[1]), value=float("nan"))
    paged_kv[order.to(device)] = src_kv.reshape(-1, page_size, 512)
    paged_k_pe[order.to(device)] = src_k_pe.reshape(-1, page_size, 64)
    block_table = order.reshape(len(lens), pages_per_seq).to(device=device, dtype=torch.int32)
    paged = torch.ops.mla.decode(
        q, q_pe, paged_kv, paged_k_pe, kv_len_per_split=128, block_table=block_table, seq_lens=seq_lens
    )
    ref_out, _ = decode_reference(q, q_pe, kv, k_pe, seq_lens=seq_lens)
    assert_matches_reference(dense, None, ref_out, None, torch.float32, "dense")
    assert_matches_reference(paged, None, ref_out, None, torch.float32, "paged")


def test_block_table_is_a_column_slice(device, gen):
    """block_table may be a view whose row stride exceeds its width (a slice of a bigger table)."""
    problem = make_problem(gen, device=device, dtype=torch.bfloat16, lens=[70, 33, 0], num_heads=16, page_size=16)
    wide = torch.full((3, problem.block_table.shape[1] + 5), -7, dtype=torch.int32, device=device)
    wide[:, : problem.block_table.shape[1]] = problem.block_table
    problem.block_table = wide[:, : problem.block_table.shape[1]]
    assert not problem.block_table.is_contiguous()
    out, lse = decode_all_ways(problem, kv_len_per_split=32)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16)


def test_sequences_sharing_pages(device, gen):
    """Prefix sharing: several sequences point at the same physical pages (and one page appears twice in a row)."""
    problem = make_problem(gen, device=device, dtype=torch.float16, lens=[64, 64], num_heads=8, page_size=16)
    shared = problem.block_table[0, :4]
    problem.block_table = torch.stack([shared, torch.cat([shared[:2], shared[:1], shared[3:]])]).contiguous()
    problem.seq_lens = torch.tensor([64, 61], dtype=torch.int32, device=device)
    out, lse = decode_all_ways(problem, kv_len_per_split=16)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float16)
