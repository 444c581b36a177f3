"""Stress: many calls with changing shapes in one process (no error, no leaked memory, results bitwise stable),
two CUDA streams decoding different problems at once, and CPU calls from two threads at once; concurrent results
equal serial ones bit for bit."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

import mla_ext
from tests.support.axes import requires_cuda
from tests.support.make_inputs import empty_outputs_like, make_problem, random_states

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def problem_pool(gen, device, count):
    """`count` small problems that together vary B, H, S_q, causal, lengths, page size, dtype and split."""
    rng = random.Random(1234)
    pool = []
    for i in range(count):
        page_size = [None, 1, 16, 64][i % 4]
        batch = rng.randint(1, 6)
        lens = [rng.randint(0, 300) for _ in range(batch)]
        problem = make_problem(
            gen,
            device=device,
            dtype=DTYPES[i % 3],
            lens=lens,
            num_heads=rng.choice([1, 3, 16, 24, 32, 64, 128]),
            seqlen_q=rng.choice([1, 1, 2]),
            causal=rng.random() < 0.5,
            page_size=page_size,
            dense_slack=rng.randint(0, 20),
        )
        pool.append((problem, rng.choice([None, 16, 64, 256])))
    return pool


def call(problem, kv_len_per_split, how):
    """One op call in one of three spellings; returns (out, lse)."""
    kwargs = problem.kwargs(kv_len_per_split=kv_len_per_split)
    if how == 0:
        return torch.ops.mla.decode_with_lse(*problem.args(), **kwargs)
    if how == 1:
        out, lse = empty_outputs_like(problem.q)
        torch.ops.mla.decode_out(*problem.args(), **kwargs, out=out, lse=lse)
        return out, lse
    return mla_ext.decode(*problem.args(), return_lse=True, **kwargs)


@requires_cuda
def test_ten_thousand_calls_with_changing_shapes(gen):
    pool = problem_pool(gen, "cuda", 40)
    # Pairs of states of one shape each, the shapes changing from pair to pair.
    merge_pairs = [
        (*random_states(gen, (b, 16), torch.bfloat16, "cuda"), *random_states(gen, (b, 16), torch.bfloat16, "cuda"))
        for b in (1, 3, 7)
    ]
    expected = [call(problem, split, 0) for problem, split in pool]
    expected_merge = [mla_ext.merge_states(*pair) for pair in merge_pairs]
    for problem, split in pool:  # a warm-up pass over every shape: the caching allocator's steady state
        call(problem, split, 1)
    torch.cuda.synchronize()
    start_allocated = torch.cuda.memory_allocated()
    start_reserved = torch.cuda.memory_reserved()

    began = time.perf_counter()
    calls = 10_000
    for i in range(calls):
        if i % 50 == 49:
            pair = (i // 50) % len(merge_pairs)
            out, lse = mla_ext.merge_states(*merge_pairs[pair])
            if i % 1000 == 999:
                assert torch.equal(out, expected_merge[pair][0]) and torch.equal(lse, expected_merge[pair][1]), f"{i}"
            continue
        index = i % len(pool)
        problem, split = pool[index]
        out, lse = call(problem, split, i % 3)
        if i % 97 == 0:  # a sample, bit for bit (each comparison synchronises)
            assert torch.equal(out, expected[index][0]) and torch.equal(lse, expected[index][1]), f"call {i}"
    del out, lse
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - began

    assert torch.cuda.memory_allocated() == start_allocated, "memory still allocated after the calls"
    assert torch.cuda.memory_reserved() <= start_reserved + (64 << 20), "the caching allocator kept growing"
    assert elapsed < 30, f"{calls} small calls took {elapsed:.1f} s"


def long_pair(gen, device):
    """Two different problems big enough to overlap on the GPU: many heads paged bf16, and few heads dense fp16
    with many splits (main kernel + combine)."""
    many_heads = make_problem(
        gen, device=device, dtype=torch.bfloat16, lens=[2000, 1500, 700, 1], num_heads=128, page_size=64
    )
    few_heads = make_problem(
        gen, device=device, dtype=torch.float16, lens=[4000, 0, 3000, 2048, 17, 4000], num_heads=16, seqlen_q=2
    )
    return [(many_heads, None), (few_heads, 128)]


@requires_cuda
def test_two_streams_match_serial(gen):
    pair = long_pair(gen, "cuda")
    serial = [call(problem, split, 0) for problem, split in pair]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    ready = torch.cuda.current_stream().record_event()
    results = [[], []]
    for stream in streams:
        stream.wait_event(ready)  # inputs were written on the current stream
    for i in range(30):
        for which, stream in enumerate(streams):
            problem, split = pair[which]
            with torch.cuda.stream(stream):
                results[which].append(call(problem, split, i % 3))
    for stream in streams:
        torch.cuda.current_stream().wait_event(stream.record_event())
    torch.cuda.synchronize()
    for which in range(2):
        for i, (out, lse) in enumerate(results[which]):
            assert torch.equal(out, serial[which][0]), f"stream {which}, call {i}: out differs from the serial run"
            assert torch.equal(lse, serial[which][1]), f"stream {which}, call {i}: lse differs from the serial run"


@requires_cuda
def test_side_stream_call_is_ordered_after_its_inputs(gen):
    """Inputs written on a side stream right before the call (no host sync): the op launches on that stream, so it
    reads the new values."""
    problem, split = long_pair(gen, "cuda")[1]
    expected = call(problem, split, 0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000)  # keep the side stream busy, so a launch on the wrong stream reads stale data
        problem.q.mul_(-1)
        problem.q_pe.mul_(-1)
        flipped = call(problem, split, 1)
        problem.q.mul_(-1)
        problem.q_pe.mul_(-1)
        again = call(problem, split, 2)
    torch.cuda.synchronize()
    assert not torch.equal(flipped[0], expected[0])
    assert torch.equal(again[0], expected[0]) and torch.equal(again[1], expected[1])


@pytest.mark.parametrize("device", ["cpu"])
def test_threads_match_serial(device, gen):
    """Two Python threads calling the CPU op at once (each call fans out over the intra-op thread pool)."""
    pair = long_pair(gen, device)
    serial = [call(problem, split, 0) for problem, split in pair]
    results = [[], []]
    errors = []

    def worker(which):
        try:
            for i in range(6):
                results[which].append(call(*pair[which], i % 3))
        except Exception as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(which,)) for which in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for which in range(2):
        for out, lse in results[which]:
            assert torch.equal(out, serial[which][0]) and torch.equal(lse, serial[which][1])
