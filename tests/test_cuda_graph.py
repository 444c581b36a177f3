"""CUDA graphs: decode_out captured once replays correctly after seq_lens / block_table contents change."""

from __future__ import annotations

import random

import pytest
import torch

from tests.reference import decode_reference
from tests.support.axes import requires_cuda
from tests.support.checks import assert_matches_reference
from tests.support.graphs import capture
from tests.support.launch_paths import CLUSTER_MERGE, HOPPER, ITEM_PAIRS, SM90
from tests.support.make_inputs import empty_outputs_like, make_problem

CAPACITY = 320
# Lengths per replay: shrink, grow, hit 0 and 1, fill the capacity.
REPLAY_LENS = [[200, 150, 64, 5], [1, 0, 300, 64], [0, 0, 0, 0], [1, 1, 1, 1], [320, 2, 17, 0], [77, 320, 1, 319]]


def check_replays(problem, kv_len_per_split, replay_lens=REPLAY_LENS):
    """Captures decode_out once, then replays it over replay_lens (and, paged, rotated block tables); every replay
    must match the float64 reference. Returns the launches per path made while capturing."""
    out, lse = empty_outputs_like(problem.q)
    kwargs = problem.kwargs(kv_len_per_split=kv_len_per_split, out=out, lse=lse)

    def step():
        torch.ops.mla.decode_out(*problem.args(), **kwargs)

    graph, _, launched = capture(step)

    original_table = None if problem.block_table is None else problem.block_table.clone()
    for replay, lens in enumerate(replay_lens):
        problem.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        if original_table is not None:  # hand each sequence another sequence's pages (rows rotated by `replay`)
            problem.block_table.copy_(original_table.roll(replay, dims=0))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
        assert_matches_reference(out, lse, ref_out, ref_lse, problem.q.dtype, f"replay {replay} lens {lens}")
    return launched


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
    check_replays(problem, kv_len_per_split)


@requires_cuda
@pytest.mark.parametrize("page_size", [None, 64], ids=["dense", "paged64"])
def test_graph_replay_of_two_pieces_at_128_heads(page_size, gen):
    """H = 128 split in 2 pieces (192 + 128 keys): on Hopper the sm_90a kernel's pieces merge in thread-block clusters,
    captured in the graph."""
    problem = make_problem(
        gen,
        device="cuda",
        dtype=torch.bfloat16,
        lens=[CAPACITY] * 4,
        num_heads=128,
        page_size=page_size,
        dense_seq_lens=True,
        spare_slots=0,
    )
    launched = check_replays(problem, 192)
    if HOPPER:
        assert launched[SM90] == 1 and launched[CLUSTER_MERGE] == 1, f"launches per path {launched}"


@requires_cuda
@pytest.mark.parametrize("page_size", [None, 64], ids=["dense", "paged64"])
def test_graph_replay_of_work_item_pairs(page_size, gen):
    """H = 128, 24 sequences with seq_lens: on Hopper the work items run in clusters of two (B is in the range that
    equal lengths cut in two pieces each), captured in the graph; each replay's lengths decide which sequences pair
    (all at 1000 keys, some in ragged batches, none when all are empty or when half are full and cut in four)."""
    batch = 24
    problem = make_problem(
        gen,
        device="cuda",
        dtype=torch.bfloat16,
        lens=[1024] * batch,
        num_heads=128,
        page_size=page_size,
        dense_seq_lens=True,
        spare_slots=0,
    )
    rng = random.Random(int(torch.randint(1 << 30, (1,), generator=gen)))
    replay_lens = [
        [1000] * batch,
        [rng.randint(0, 1024) for _ in range(batch)],
        [0] * batch,
        [1024] * 12 + [1] * 12,
        [rng.randint(700, 900) for _ in range(batch - 1)] + [1024],
    ]
    launched = check_replays(problem, None, replay_lens)
    if HOPPER:
        assert launched[SM90] == 1 and launched[ITEM_PAIRS] == 1, f"launches per path {launched}"


@requires_cuda
@pytest.mark.parametrize("page_size", [None, 64], ids=["dense", "paged64"])
def test_graph_decode_with_lse_and_merge(page_size, gen):
    """The allocating ops in a graph, at H=128 (the many-row kernel), S_q=1, fp16: each cache's prefix and suffix
    decoded with decode_with_lse and merged with merge_states, the split lengths derived from seq_lens on the
    device. Every replay follows the new lengths and pages, for the parts and for the merged whole."""
    split_at = 128  # keys in the prefix (two 64-token pages)
    problem = make_problem(
        gen,
        device="cuda",
        dtype=torch.float16,
        lens=[CAPACITY] * 4,
        num_heads=128,
        page_size=page_size,
        dense_seq_lens=True,
        spare_slots=0,
    )
    q, q_pe, kv, k_pe = problem.args()
    if page_size is None:
        prefix_cache, suffix_cache = (kv[:, :split_at], k_pe[:, :split_at]), (kv[:, split_at:], k_pe[:, split_at:])
    else:
        prefix_cache = suffix_cache = (kv, k_pe)

    def step():
        prefix_lens = problem.seq_lens.clamp(max=split_at)
        suffix_lens = (problem.seq_lens - split_at).clamp(min=0)
        tables = (None, None)
        if page_size is not None:
            first_suffix_page = split_at // page_size
            tables = (problem.block_table[:, :first_suffix_page], problem.block_table[:, first_suffix_page:])
        prefix = torch.ops.mla.decode_with_lse(q, q_pe, *prefix_cache, block_table=tables[0], seq_lens=prefix_lens)
        suffix = torch.ops.mla.decode_with_lse(q, q_pe, *suffix_cache, block_table=tables[1], seq_lens=suffix_lens)
        whole = torch.ops.mla.decode_with_lse(*problem.args(), **problem.kwargs())
        return prefix, whole, torch.ops.mla.merge_states(*prefix, *suffix)

    graph, (prefix, whole, merged), _ = capture(step)
    original_table = None if page_size is None else problem.block_table.clone()
    for replay, lens in enumerate(REPLAY_LENS):
        problem.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        if page_size is not None:
            problem.block_table.copy_(original_table.roll(replay, dims=0))
        for tensor in (*prefix, *whole, *merged):
            tensor.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        what = f"replay {replay} lens {lens}"
        ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
        assert_matches_reference(*whole, ref_out, ref_lse, torch.float16, f"{what}, whole")
        assert_matches_reference(*merged, ref_out, ref_lse, torch.float16, f"{what}, prefix + suffix merged")
        prefix_kwargs = dict(problem.reference_kwargs(), seq_lens=problem.seq_lens.clamp(max=split_at))
        ref_out, ref_lse = decode_reference(*problem.args(), **prefix_kwargs)
        assert_matches_reference(*prefix, ref_out, ref_lse, torch.float16, f"{what}, prefix")
