#!/usr/bin/env python3
"""Random-configuration fuzzing of the CUDA decode against the CPU kernel, and both against the float64 reference
on a sample of the cases.

Each case draws B, H (1..128), S_q (1..4), causal, lengths (0 included), dense or paged (page sizes 1..256), strided
query views, fused 576-wide cache views, dtype, a default or explicit kv_len_per_split, the op spelling, and now
and then hostile seq_lens / block_table values. Case i of seed S is reproducible on its own:

    python3 -m scripts.fuzz_cuda --count 2000 --time-limit 120          # stop at 2000 cases or 120 s
    python3 -m scripts.fuzz_cuda --seed 7 --case 1234                    # replay one failure

Run from the repository root (it imports tests.support and tests.reference).

Exit status: 0 when every case passed, 1 on any failure, 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback

import torch

import mla_ext
from tests.reference import decode_reference
from tests.support.checks import assert_matches_reference
from tests.support.make_inputs import empty_outputs_like, make_problem

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
HEADS = [1, 2, 3, 4, 7, 8, 12, 16, 17, 24, 31, 32, 33, 48, 64, 65, 100, 127, 128]
PAGE_SIZES = [None, None, None, 1, 2, 3, 16, 16, 17, 32, 64, 64, 128, 256]
MAX_LENS = [1, 2, 15, 16, 17, 63, 64, 65, 100, 255, 256, 257, 513, 1000, 1024, 2048]
INT32_MAX = 2**31 - 1


def case_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index) % 2**63


def draw_config(seed: int, index: int, max_len_cap: int) -> dict:
    rng = random.Random(case_seed(seed, index))
    batch = rng.choice([0, 1, 1, 2, 3, 4, 5, 8])
    max_len = min(rng.choice(MAX_LENS), max_len_cap)
    lens = [rng.choice([0, max_len, rng.randint(0, max_len), rng.randint(0, max_len)]) for _ in range(batch)]
    return {
        "dtype": rng.choice(list(DTYPES)),
        "lens": lens,
        "num_heads": rng.choice(HEADS) if rng.random() < 0.7 else rng.randint(1, 128),
        "seqlen_q": rng.randint(1, 4),
        "causal": rng.random() < 0.5,
        "page_size": rng.choice(PAGE_SIZES),
        "dense_slack": rng.choice([0, 0, rng.randint(1, 40)]),
        "q_layout": rng.choice(["contiguous", "transposed", "fused"]),
        "cache_layout": rng.choice(["separate", "fused"]),
        "kv_len_per_split": None if rng.random() < 0.5 else 16 * rng.randint(1, 64),
        "op": rng.choice(["decode_with_lse", "decode_out", "mla_ext.decode"]),
        "hostile": rng.random() < 0.15,
        "hostile_seed": rng.randint(0, 2**31 - 1),
    }


def build(config: dict, seed: int, index: int, device: str):
    """The case's problem on `device`; the same seed gives the same values on every device."""
    gen = torch.Generator().manual_seed(case_seed(seed, index))
    problem = make_problem(
        gen,
        device=device,
        dtype=DTYPES[config["dtype"]],
        lens=config["lens"],
        num_heads=config["num_heads"],
        seqlen_q=config["seqlen_q"],
        causal=config["causal"],
        page_size=config["page_size"],
        cache_layout=config["cache_layout"],
        q_layout=config["q_layout"],
        dense_slack=config["dense_slack"],
    )
    if config["hostile"]:
        make_hostile(problem, random.Random(config["hostile_seed"]))
    return problem


def make_hostile(problem, rng: random.Random):
    """Values the kernel must clamp or hide without a host check: lengths past the capacity or negative, table
    entries outside [0, P) inside the used pages."""
    if problem.seq_lens is None or problem.seq_lens.numel() == 0:
        return
    # A length clamped to the capacity makes poisoned slack slots visible: give them finite values first (NaN in
    # visible keys is a different question, see tests/test_nan_hygiene.py).
    for cache in (problem.kv, problem.k_pe):
        cache.nan_to_num_(nan=0.5, posinf=1.0, neginf=-1.0)
    batch = problem.seq_lens.numel()
    for _ in range(rng.randint(1, 2)):
        problem.seq_lens[rng.randrange(batch)] = rng.choice([-1, -(2**31), INT32_MAX, 10**6])
    if problem.block_table is not None:
        num_pages = problem.kv.shape[0]
        for _ in range(rng.randint(1, 3)):
            entry = (rng.randrange(batch), rng.randrange(problem.block_table.shape[1]))
            problem.block_table[entry] = rng.choice([-1, num_pages, INT32_MAX, -(2**31)])


def run_op(problem, config):
    kwargs = problem.kwargs(kv_len_per_split=config["kv_len_per_split"])
    if config["op"] == "decode_with_lse":
        return torch.ops.mla.decode_with_lse(*problem.args(), **kwargs)
    if config["op"] == "decode_out":
        out, lse = empty_outputs_like(problem.q)  # NaN-poisoned: an element the kernel skips stays NaN
        torch.ops.mla.decode_out(*problem.args(), **kwargs, out=out, lse=lse)
        return out, lse
    return mla_ext.decode(*problem.args(), return_lse=True, **kwargs)


def run_case(config: dict, seed: int, index: int, with_reference: bool):
    """Raises AssertionError (or the op's error) when the case fails."""
    dtype = DTYPES[config["dtype"]]
    cpu_problem = build(config, seed, index, "cpu")
    cuda_problem = build(config, seed, index, "cuda")
    cuda_out, cuda_lse = run_op(cuda_problem, config)
    cpu_out, cpu_lse = run_op(cpu_problem, config)
    # Both kernels round: allow twice the tolerance between them; against the reference, the contract's.
    assert_matches_reference(cuda_out, cuda_lse, cpu_out, cpu_lse, dtype, "CUDA vs CPU", tolerance_scale=2.0)
    if with_reference:
        ref_out, ref_lse = decode_reference(*cpu_problem.args(), **cpu_problem.reference_kwargs())
        assert_matches_reference(cuda_out, cuda_lse, ref_out, ref_lse, dtype, "CUDA vs reference")
        assert_matches_reference(cpu_out, cpu_lse, ref_out, ref_lse, dtype, "CPU vs reference")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1000, help="cases to run (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the case sequence (default 0)")
    parser.add_argument("--time-limit", type=float, default=None, help="stop starting new cases after SECONDS")
    parser.add_argument("--case", type=int, default=None, help="run only case CASE of --seed (a replay)")
    parser.add_argument("--reference-every", type=int, default=10, help="also check the float64 reference every N")
    parser.add_argument("--max-len", type=int, default=2048, help="longest sequence drawn (default 2048)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("fuzz_cuda: no CUDA device; this script compares the CUDA kernels with the CPU kernel", file=sys.stderr)
        return 2

    indices = [args.case] if args.case is not None else range(args.count)
    began = time.perf_counter()
    failures = []
    ran = 0
    for index in indices:
        if args.time_limit is not None and time.perf_counter() - began > args.time_limit:
            print(f"fuzz_cuda: time limit of {args.time_limit:g} s reached")
            break
        config = draw_config(args.seed, index, args.max_len)
        with_reference = args.case is not None or index % max(args.reference_every, 1) == 0
        try:
            run_case(config, args.seed, index, with_reference)
        except Exception as error:  # a failure of any kind is reported with its replay command
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            failures.append((index, config, message))
            print(
                f"FAIL case {index}: {message}\n  config {config}\n  replay: python3 {sys.argv[0]} --seed "
                f"{args.seed} --case {index}",
                flush=True,
            )
            if args.case is not None:
                traceback.print_exc()
        ran += 1
        if ran % 200 == 0:
            print(f"fuzz_cuda: {ran} cases, {len(failures)} failures, {time.perf_counter() - began:.0f} s", flush=True)
    elapsed = time.perf_counter() - began
    print(f"fuzz_cuda: seed {args.seed}: {ran} cases in {elapsed:.1f} s, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
