"""A bounded property search over small random shapes: any valid problem matches the float64 reference."""

from __future__ import annotations

import pytest
import torch
from axes import DEVICES
from checks import assert_matches_reference, decode_all_ways
from hypothesis import given, settings
from hypothesis import strategies as st
from make_inputs import make_problem
from reference import decode_reference

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
