"""Measuring helpers shared by the benchmarks and scripts/context_parallel.py: the traffic and work model of one
decode call, and a latency probe that works the same way on CPU and CUDA."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from mla_ext import HEAD_DIM, ROPE_DIM

KEY_DIM = HEAD_DIM + ROPE_DIM  # 576 values per cached key; a query row reads as many


def decode_bytes(num_heads: int, seq_lens: Sequence[int], elt: int) -> int:
    """Bytes one single-token decode call must move at least: every visible key once, each query row read and
    each output row written once."""
    return sum(seq_lens) * KEY_DIM * elt + len(seq_lens) * num_heads * (KEY_DIM + HEAD_DIM) * elt


def decode_flops(num_heads: int, seq_lens: Sequence[int]) -> int:
    """FLOPs of one single-token decode call: q.k over KEY_DIM values plus p.v over HEAD_DIM, a multiply-add each."""
    return 2 * num_heads * sum(seq_lens) * (KEY_DIM + HEAD_DIM)


def format_rate(value: float) -> str:
    """About three significant figures, never an exponent: 4268, 95.3, 1.27, 0.0421."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}" if value >= 1e-3 else f"{value:.5f}"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_us(fn: Callable[[], object], device: torch.device, repeats: int = 5, warmup_s: float = 0.1) -> float:
    """Median time of one fn() call in microseconds, after calling it for about warmup_s first.

    The warm-up matters on GPUs: the clock ramps up under load, so a cold probe reads low. CUDA calls are timed
    with events on the current stream, CPU calls with the wall clock.
    """
    fn()
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    once_s = max(time.perf_counter() - start, 1e-7)
    for _ in range(max(0, math.ceil(warmup_s / once_s) - 1)):
        fn()
    synchronize(device)

    return statistics.median(time_once_us(fn, device) for _ in range(repeats))


def time_once_us(fn: Callable[[], object], device: torch.device) -> float:
    """Microseconds of one fn() call: CUDA events on the current stream, the wall clock on CPU."""
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) * 1e3
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e6
