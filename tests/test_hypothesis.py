"""A bounded property search over small random shapes: any valid problem matches the float64 reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import decode_reference
from tests.support.axes import DEVICES
from tests.support.checks import assert_matches_reference, decode_all_ways
from tests.support.make_inputs import make_problem

problems = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**31 - 1),
        "dtype": st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
        "lens": st.lists(st.integers(0, 300), min_size=0, max_size=4),
        "num_heads": st.integers(1, 40),
        "seqlen_q": st.integers(1, 3),
        "causal": st.booleans(),
        "page_size": st.one_of(st.none(), st.integers(1, 70)),
        "kv_len_per_split": st.one_of(st.none(), st.integers(1, 24).map(lambda k: 16 * k)),
        "cache_layout": st.sampled_from(["separate", "fused"]),
        "q_layout": st.sampled_from(["contiguous", "transposed", "fused"]),
    }
)


@pytest.mark.parametrize("device", DEVICES)  # a parameter, not the fixture: hypothesis reruns the body
@settings(max_examples=25, deadline=None, derandomize=True)
@given(case=problems)
def test_random_problems_match_reference(case, device):
    gen = torch.Generator().manual_seed(case["seed"])
    lens = case["lens"]
    problem = make_problem(
        gen,
        device=device,
        dtype=case["dtype"],
        lens=lens,
        num_heads=case["num_heads"],
        seqlen_q=case["seqlen_q"],
        causal=case["causal"],
        page_size=case["page_size"],
        cache_layout=case["cache_layout"],
        q_layout=case["q_layout"],
        dense_slack=3,
    )
    out, lse = decode_all_ways(problem, kv_len_per_split=case["kv_len_per_split"])
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, case["dtype"])


INT32_EDGES = [-(2**31), -1, 2**31 - 1]

hostile_problems = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**31 - 1),
        "lens": st.lists(st.integers(0, 200), min_size=1, max_size=4),
        "num_heads": st.integers(1, 20),
        "page_size": st.one_of(st.none(), st.integers(1, 40)),
        "kv_len_per_split": st.one_of(st.none(), st.integers(1, 8).map(lambda k: 16 * k)),
        # (sequence index, value) pairs; a value of None means "capacity + 1", the smallest too-long length
        "bad_lens": st.lists(st.tuples(st.integers(0, 3), st.sampled_from([*INT32_EDGES, None])), max_size=2),
        # (sequence index, slot index, value) pairs; None means P, the first page past the cache
        "bad_pages": st.lists(
            st.tuples(st.integers(0, 3), st.integers(0, 20), st.sampled_from([*INT32_EDGES, None])), max_size=3
        ),
    }
)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=20, deadline=None, derandomize=True)
@given(case=hostile_problems)
def test_hostile_index_values_match_reference(case, device):
    """Out-of-range seq_lens clamp to [0, capacity] and out-of-range block-table entries hide their page, exactly
    as the reference reads them, whatever the values."""
    gen = torch.Generator().manual_seed(case["seed"])
    lens = case["lens"]
    problem = make_problem(
        gen,
        device=device,
        dtype=torch.float32,
        lens=lens,
        num_heads=case["num_heads"],
        page_size=case["page_size"],
        dense_seq_lens=True,
    )
    for cache in (problem.kv, problem.k_pe):  # clamped lengths may reveal poisoned slack: make it ordinary data
        cache.nan_to_num_(nan=0.25, posinf=2.0, neginf=-2.0)
    if problem.block_table is None:
        capacity = problem.kv.shape[1]
    else:
        capacity = problem.block_table.shape[1] * case["page_size"]
        for b, slot, value in case["bad_pages"]:
            if b < len(lens) and slot < problem.block_table.shape[1]:
                problem.block_table[b, slot] = problem.kv.shape[0] if value is None else value
    for b, value in case["bad_lens"]:
        if b < len(lens):
            problem.seq_lens[b] = capacity + 1 if value is None else value
    out, lse = decode_all_ways(problem, kv_len_per_split=case["kv_len_per_split"])
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float32)
