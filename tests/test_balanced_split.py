"""The default split of a call with seq_lens: on CUDA it is planned on device from the actual lengths (balanced
splits). Few rows: the batch's keys cut into equal ranges, one per CTA (every CTA derives the same cuts), so long
sequences become many pieces and a CTA may walk several short ones. Many rows: long sequences cut into work items
of about equal length, one per CTA (a planner kernel writes them to a table, one warp of it up to 32 sequences and
one thread per sequence above; one sequence's CTAs plan their own).
Ragged batches, batches wider than a warp, hundreds of short sequences, and short sequences in long capacities,
against the float64 reference."""

from __future__ import annotations

import random

import pytest
import torch

from tests.reference import decode_reference
from tests.support.axes import DTYPE_IDS, DTYPES, requires_cuda
from tests.support.checks import assert_matches_reference, decode_all_ways
from tests.support.make_inputs import make_problem


def ragged_lens(seed, batch, long_len, long_count):
    """A few long sequences among many short ones, with 0 and 1 included, in shuffled order."""
    rng = random.Random(seed)
    lens = [long_len] * long_count + [0, 1] + [rng.randint(2, 300) for _ in range(batch - long_count - 2)]
    rng.shuffle(lens)
    return lens


@pytest.mark.parametrize(
    "num_heads,seqlen_q,causal", [(16, 1, False), (128, 1, False), (16, 2, True)], ids=["h16", "h128", "h16-sq2"]
)
@pytest.mark.parametrize("page_size", [None, 64, 16], ids=["dense", "page64", "page16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_ragged_batch_with_default_split(dtype, page_size, num_heads, seqlen_q, causal, device, gen):
    # 45 sequences: the ranges' plan walks the batch in two warp-wide rounds, the work items' planner in two warps.
    lens = ragged_lens(int(torch.randint(1 << 30, (1,), generator=gen)), 45, 2500, 3)
    problem = make_problem(
        gen,
        device=device,
        dtype=dtype,
        lens=lens,
        num_heads=num_heads,
        seqlen_q=seqlen_q,
        causal=causal,
        page_size=page_size,
    )
    out, lse = decode_all_ways(problem)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"lens {lens}")


@pytest.mark.parametrize("num_heads", [1, 24, 128])
@pytest.mark.parametrize("batch", [2, 7, 32, 33])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_one_long_sequence_among_short_ones(dtype, batch, num_heads, device, gen):
    """On CUDA the combine lays each sequence's units out by its own piece count (one long sequence of many pieces,
    short ones of one; one head leaves most of a CTA's warps without a unit)."""
    rng = random.Random(int(torch.randint(1 << 30, (1,), generator=gen)))
    lens = [3000] + [rng.randint(0, 300) for _ in range(batch - 1)]
    rng.shuffle(lens)
    problem = make_problem(gen, device=device, dtype=dtype, lens=lens, num_heads=num_heads, page_size=64)
    out, lse = decode_all_ways(problem)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"lens {lens}")


@requires_cuda
@pytest.mark.parametrize("uniform", [False, True], ids=["ragged", "uniform"])
@pytest.mark.parametrize("num_heads", [40, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DTYPE_IDS.get)
def test_more_sequences_than_combine_threads(dtype, num_heads, uniform, gen):
    """600 sequences of many rows. bf16 takes the many-row work items, planned by the planner kernel's 512-thread CTA
    in two rounds over the batch, whose per-sequence combine gives each of its 512 layout threads two sequences; fp32
    walks ranges and keeps the fixed-count combine. Ragged: long ones of many pieces among short and empty ones of
    one. Uniform: sequences in one piece (every one for the work items, 600 of them fill several waves), whose outputs
    the main kernel writes and the combine must leave alone."""
    rng = random.Random(int(torch.randint(1 << 30, (1,), generator=gen)))
    lens = [300] * 600 if uniform else [3000, 2000, 1000] + [rng.randint(0, 40) for _ in range(597)]
    rng.shuffle(lens)
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=lens, num_heads=num_heads, page_size=64)
    out, lse = decode_all_ways(problem)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"lens {lens}")


@requires_cuda
@pytest.mark.parametrize(
    "batch,length",
    [(2, 33), (3, 0), (16, 3841), (16, 4000), (40, 777), (528, 40)],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("num_heads,seqlen_q,causal", [(16, 1, False), (8, 2, True)], ids=["h16", "h8-sq2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_equal_lengths_on_whole_pieces(dtype, num_heads, seqlen_q, causal, batch, length, gen):
    """Every sequence of the same length: on CUDA the few-row plan cuts each sequence into equal pieces, one per range,
    its set-up positions padding it to whole ranges (up to one wave of sequences), or puts m whole sequences in a
    range (more), so no range starts a second sequence. Cases the whole-piece line takes (a last piece of one key,
    pieces of unequal length, more sequences than ranges: two per range, four for fp32's one CTA per SM) and ones it
    leaves to the general line (short and empty sequences, whose line is mostly set-up)."""
    problem = make_problem(
        gen,
        device="cuda",
        dtype=dtype,
        lens=[length] * batch,
        num_heads=num_heads,
        seqlen_q=seqlen_q,
        causal=causal,
        page_size=64,
    )
    out, lse = decode_all_ways(problem)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"{batch} sequences of {length} keys")


@requires_cuda
@pytest.mark.parametrize(
    "num_heads,batch,ragged",
    [(128, 23, False), (64, 45, False), (64, 45, True)],
    ids=["h128-b23", "h64-b45", "h64-b45-ragged"],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_splits_lengthened_to_one_wave(dtype, num_heads, batch, ragged, gen):
    """Many rows, about 4K keys per sequence: an even cut gives each sequence 3 pieces, a few more work items than one
    wave of CTAs (69 for 66 at 128 heads, 135 for 132 at 64 on a 132-SM GPU), so the planner lengthens the splits
    until they fit, over one or more rounds (ragged: sequences lose their third piece at different lengths). What is
    checked is the result of such plans against the float64 reference; the plan itself is not visible from Python (its
    one-wave fit was timed, perf-log v52)."""
    rng = random.Random(int(torch.randint(1 << 30, (1,), generator=gen)))
    lens = [4096 + (rng.randint(-600, 600) if ragged else 0) for _ in range(batch)]
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=lens, num_heads=num_heads, page_size=64)
    out, lse = decode_all_ways(problem)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"lens {lens}")


@pytest.mark.parametrize(
    "num_heads,page_size",
    [(16, 64), (24, 16), (128, 64), (128, 16)],
    ids=["h16-page64", "h24-page16", "h128-page64", "h128-page16"],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_many_short_sequences(dtype, num_heads, page_size, device, gen):
    """298 sequences of 0-40 keys around two long ones. Few rows: most CTAs' ranges hold several whole sequences,
    and the cuts fall inside the long ones and inside short ones alike. Many rows: hundreds of one-piece items."""
    rng = random.Random(int(torch.randint(1 << 30, (1,), generator=gen)))
    lens = [rng.randint(0, 40) for _ in range(298)] + [3000, 1500]
    rng.shuffle(lens)
    problem = make_problem(gen, device=device, dtype=dtype, lens=lens, num_heads=num_heads, page_size=page_size)
    out, lse = decode_all_ways(problem)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"lens {lens}")


@pytest.mark.parametrize("page_size", [None, 64], ids=["dense", "page64"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_long_sequences_cut_into_one_wave(dtype, page_size, device, gen):
    """Many rows, two long sequences among 62 short ones that outnumber the SMs left beside the long pieces: on
    GPUs of 100+ SMs the plan cuts the long sequences into one wave of pieces, the short items follow."""
    rng = random.Random(int(torch.randint(1 << 30, (1,), generator=gen)))
    lens = [8192, 8192 - 37, 0, 1] + [rng.randint(2, 100) for _ in range(60)]
    rng.shuffle(lens)
    problem = make_problem(gen, device=device, dtype=dtype, lens=lens, num_heads=128, page_size=page_size)
    out, lse = decode_all_ways(problem)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"lens {lens}")


@pytest.mark.parametrize("fill", ["full", "one-short", "half"])
@pytest.mark.parametrize("capacity", [1000, 4096, 16700])
@pytest.mark.parametrize("num_heads", [24, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_one_sequence_of_many_rows(dtype, num_heads, capacity, fill, device, gen):
    """One sequence's work items: on CUDA the grid and the combine are sized from the pieces the capacity allows, not
    a wave of CTAs, so the device's cut of any length up to the capacity must fit them (a piece without a CTA would
    drop its keys from the result)."""
    length = {"full": capacity, "one-short": capacity - 1, "half": capacity // 2 + 13}[fill]
    problem = make_problem(
        gen,
        device=device,
        dtype=dtype,
        lens=[length],
        num_heads=num_heads,
        dense_slack=capacity - length,
        dense_seq_lens=True,
    )
    out, lse = decode_all_ways(problem)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"length {length} of {capacity}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=DTYPE_IDS.get)
def test_short_sequence_in_long_capacity(dtype, device, gen):
    """One short sequence in a dense cache sized for a long context: the split follows the length, not the size."""
    problem = make_problem(gen, device=device, dtype=dtype, lens=[700], num_heads=16, dense_slack=20000)
    out, lse = decode_all_ways(problem)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)


def test_default_split_is_deterministic_and_follows_lengths(device, gen):
    """Same inputs, same bits; and changing one sequence's length changes only what the reference says it should."""
    lens = ragged_lens(7, 40, 3000, 2)
    problem = make_problem(gen, device=device, dtype=torch.bfloat16, lens=lens, num_heads=16, page_size=64)
    first = decode_all_ways(problem)
    second = decode_all_ways(problem)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    shorter = list(lens)
    longest = max(range(len(lens)), key=lambda b: lens[b])
    shorter[longest] = 5
    problem.seq_lens.copy_(torch.tensor(shorter, dtype=torch.int32))
    out, lse = decode_all_ways(problem)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16, f"lens {shorter}")
