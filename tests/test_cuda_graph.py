"""CUDA graphs: decode_out captured once replays correctly after seq_lens / block_table contents change."""

from __future__ import annotations

import pytest
import torch
from axes import requires_cuda
from checks import assert_matches_reference
from make_inputs import empty_outputs_like, make_problem
from reference import decode_reference

CAPACITY = 320
# Lengths per replay: shrink, grow, hit 0 and 1, fill the capacity.
REPLAY_LENS = [[200, 150, 64, 5], [1, 0, 300, 64], [0, 0, 0, 0], [1, 1, 1, 1], [320, 2, 17, 0], [77, 320, 1, 319]]


@requires_cuda
@pytest.mark.parametrize("kv_len_per_split", [None, 64])
@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "paged"])
def test_graph_replay_follows_lengths_and_pages(page_size, kv_len_per_split, gen):
    # Every slot up to the capacity holds real keys, so any length in [0, capacity] is valid data.
    problem = make_problem(
        gen,
        device="cuda",
        dtype=torch.bfloat16,
        lens=[CAPACITY] * 4,
        num_heads=16,
        seqlen_q=2,
        causal=True,
        page_size=page_size,
        dense_seq_lens=True,
        spare_slots=0,
    )
    out, lse = empty_outputs_like(problem.q)
    kwargs = problem.kwargs(kv_len_per_split=kv_len_per_split, out=out, lse=lse)

    def step():
        torch.ops.mla.decode_out(*problem.args(), **kwargs)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    original_table = None if page_size is None else problem.block_table.clone()
    for replay, lens in enumerate(REPLAY_LENS):
        problem.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        if page_size is not None:  # hand each sequence another sequence's pages (rows rotated by `replay`)
            problem.block_table.copy_(original_table.roll(replay, dims=0))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
        assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16, f"replay {replay} lens {lens}")
