#!/usr/bin/env python3
"""The case matrix scripts/sanitize.sh runs under compute-sanitizer (as python3 -m scripts.sanitize_cases, from the
repository root): every case once, on CUDA, small enough that instrumented kernels (about 100x slower) finish
quickly. Each result is also compared with the CPU kernel, so a case that runs clean but wrong still fails.

    --subset all       memcheck's matrix: dtype x heads (1, 16, 128) x splits (one, many) x layout (dense, pages of
                       1, 16, 64), with S_q 1 / 2-causal and hostile seq_lens / block tables mixed in, plus B = 0,
                       S_kv = 0, no pages, decode_out into strided outputs, merge_states, balanced splits over
                       hundreds of short sequences, and fixed splits merged in thread-block clusters
    --subset kernels   one small case per kernel variant (dim-split few / mid rows, key-split 64 rows, fp32 SIMT,
                       the split combine, merge_states, the H >= 64 16-bit path, balanced ranges and items, the
                       cluster merge), for
                       racecheck and synccheck

Exit status: 0 when every case ran and matched, 1 otherwise, 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import traceback
from dataclasses import dataclass, field

import torch

import mla_ext
from mla_ext import HEAD_DIM, ROPE_DIM
from tests.support.checks import assert_matches_reference
from tests.support.make_inputs import empty_outputs_like, make_problem, random_states

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
INT32_MAX = 2**31 - 1
SHORT_LENS = [(i * 5) % 41 for i in range(200)] + [1000]  # 200 sequences of 0-40 keys, then 1000 keys


@dataclass
class Case:
    name: str
    dtype: str = "bf16"
    lens: list = field(default_factory=lambda: [100, 0, 37])
    num_heads: int = 16
    seqlen_q: int = 1
    causal: bool = False
    page_size: int | None = None
    kv_len_per_split: int | None = None
    q_layout: str = "contiguous"
    cache_layout: str = "separate"
    hostile: bool = False
    op: str = "decode_with_lse"  # or decode_out, merge_states
    special: str = ""  # no-pages, empty-cache
    with_seq_lens: bool = True  # dense only: without seq_lens the default split follows from shapes alone


def decode_problem(case: Case, device: str):
    gen = torch.Generator().manual_seed(sum(map(ord, case.name)))
    dtype = DTYPES[case.dtype]
    if case.special == "empty-cache":  # dense S_kv = 0: capacity 0, every row empty
        batch = len(case.lens)
        problem = make_problem(gen, device=device, dtype=dtype, lens=[1] * batch, num_heads=case.num_heads)
        problem.kv = torch.empty(batch, 0, HEAD_DIM, dtype=dtype, device=device)
        problem.k_pe = torch.empty(batch, 0, ROPE_DIM, dtype=dtype, device=device)
        problem.seq_lens = torch.tensor(case.lens, dtype=torch.int32, device=device)
        return problem
    problem = make_problem(
        gen,
        device=device,
        dtype=dtype,
        lens=case.lens,
        num_heads=case.num_heads,
        seqlen_q=case.seqlen_q,
        causal=case.causal,
        page_size=case.page_size,
        cache_layout=case.cache_layout,
        q_layout=case.q_layout,
        dense_slack=0 if not case.with_seq_lens else 3,
        dense_seq_lens=case.with_seq_lens,
    )
    if case.special == "no-pages":  # P = 0: a zero-size cache (its own, empty allocation) that must never be read
        problem.kv = torch.empty(0, *problem.kv.shape[1:], dtype=dtype, device=device)
        problem.k_pe = torch.empty(0, *problem.k_pe.shape[1:], dtype=dtype, device=device)
    if case.hostile and problem.seq_lens.numel() > 0:
        # Clamped lengths make slack slots visible: finite values there; the point is where the kernel reads.
        for cache in (problem.kv, problem.k_pe):
            cache.nan_to_num_(nan=0.5, posinf=1.0, neginf=-1.0)
        hostile_lens = [INT32_MAX, -5, -(2**31), 10**6]
        problem.seq_lens[: len(hostile_lens)] = torch.tensor(hostile_lens[: problem.seq_lens.numel()])
        if problem.block_table is not None:
            num_pages = problem.kv.shape[0]
            bad = [-1, INT32_MAX, num_pages, -(2**31)]
            rows = problem.block_table.shape[0]
            for i, value in enumerate(bad):
                problem.block_table[i % rows, i % problem.block_table.shape[1]] = value
    return problem


def run_decode(case: Case, problem):
    kwargs = problem.kwargs(kv_len_per_split=case.kv_len_per_split)
    if case.op == "decode_out":  # into NaN-poisoned outputs with q's stride order (head-major for transposed q)
        out, lse = empty_outputs_like(problem.q)
        torch.ops.mla.decode_out(*problem.args(), **kwargs, out=out, lse=lse)
        return out, lse
    return torch.ops.mla.decode_with_lse(*problem.args(), **kwargs)


def run_case(case: Case):
    dtype = DTYPES[case.dtype]
    if case.op == "merge_states":
        gen = torch.Generator().manual_seed(sum(map(ord, case.name)))
        shape = tuple(case.lens)
        states = [random_states(gen, shape, dtype, "cpu") for _ in range(2)]
        if case.num_heads != HEAD_DIM:  # merge_states takes any last dim
            states = [(out[..., : case.num_heads].contiguous(), lse) for out, lse in states]
        cuda_args = [t.cuda() for state in states for t in state]
        out, lse = mla_ext.merge_states(*cuda_args)
        torch.cuda.synchronize()
        expected = mla_ext.merge_states(*[t for state in states for t in state])
        assert_matches_reference(out, lse, *expected, dtype, case.name, tolerance_scale=2.0)
        return
    out, lse = run_decode(case, decode_problem(case, "cuda"))
    torch.cuda.synchronize()  # errors surface here, before the next case's name is printed
    expected_out, expected_lse = run_decode(case, decode_problem(case, "cpu"))
    if case.special == "":
        assert_matches_reference(out, lse, expected_out, expected_lse, dtype, case.name, tolerance_scale=2.0)
    else:
        assert torch.equal(out.cpu(), expected_out) and torch.equal(lse.cpu(), expected_lse), case.name


def full_matrix() -> list[Case]:
    cases = []
    layouts = [None, 1, 16, 64]
    combos = itertools.product(DTYPES, [1, 16, 128], [None, "many"], layouts)
    for i, (dtype, heads, splits, page_size) in enumerate(combos):
        seqlen_q, causal = [(1, False), (2, True)][i % 2]
        hostile = i % 5 == 0
        many = 16 if i % 3 else 48
        layout = "dense" if page_size is None else f"page{page_size}"
        split = many if splits else "auto"
        name = f"{dtype}-H{heads}-{layout}-Sq{seqlen_q}-split{split}{'-hostile' if hostile else ''}"
        cases.append(
            Case(
                name=name,
                dtype=dtype,
                lens=[200, 0, 37, 1] if heads < 128 else [130, 0, 17],
                num_heads=heads,
                seqlen_q=seqlen_q,
                causal=causal,
                page_size=page_size,
                kv_len_per_split=many if splits else None,
                q_layout=["contiguous", "transposed", "fused"][i % 3],
                cache_layout=["separate", "fused"][i % 2],
                hostile=hostile,
                op="decode_out" if i % 4 == 1 else "decode_with_lse",
            )
        )
    cases += [
        Case("B0-dense", lens=[]),
        Case("B0-page16", lens=[], page_size=16),
        Case("Skv0-dense", lens=[3, 0], special="empty-cache"),
        Case("no-pages-page16", lens=[5, 0], page_size=16, special="no-pages"),
        Case("H1-fp32-page1-long", dtype="fp32", lens=[2000, 3], num_heads=1, page_size=1, kv_len_per_split=256),
        Case("bf16-H16-B8-big-grid", lens=[600] * 8, kv_len_per_split=16),
        Case("bf16-H128-Sq2-dense-2k", lens=[2048], num_heads=128, seqlen_q=2, causal=True),
        Case("fp16-H24-Sq4-page64", dtype="fp16", lens=[300, 2], num_heads=24, seqlen_q=4, causal=True, page_size=64),
    ]
    cases += no_seq_lens_cases()
    cases += mid_rows_sm90_cases()
    cases += merge_cases()
    cases += balanced_cases()
    cases += cluster_merge_cases()
    return cases


def cluster_merge_cases() -> list[Case]:
    """Fixed splits of 2, 4 and 8 pieces on the few-row kernel, which Hopper merges in thread-block clusters through
    distributed shared memory (capacities 100, 8 pages of 16 and 250 keys), and 2 pieces on the sm_90a kernel (over
    16 rows)."""
    return [
        Case("dim-split-few-rows-bf16-cluster-merge-2", lens=[100, 37], num_heads=16, kv_len_per_split=64),
        Case("dim-split-few-rows-fp16-cluster-merge-4-page16", dtype="fp16", lens=[112, 3], num_heads=8,
             page_size=16, kv_len_per_split=32),  # fmt: skip
        Case("dim-split-few-rows-bf16-cluster-merge-8-Sq2", lens=[250, 0], num_heads=8, seqlen_q=2, causal=True,
             kv_len_per_split=32),  # fmt: skip
        Case("sm90-bf16-H128-cluster-merge-2", lens=[250, 0, 65], num_heads=128, kv_len_per_split=128),
        Case("sm90-fp16-H32-cluster-merge-2-page64", dtype="fp16", lens=[190, 3], num_heads=32, page_size=64,
             kv_len_per_split=128),  # fmt: skip
    ]


def merge_cases() -> list[Case]:
    return [
        Case(
            f"merge-{dtype}-{'x'.join(map(str, shape))}-D{dim}",
            dtype=dtype,
            lens=list(shape),
            num_heads=dim,
            op="merge_states",
        )
        for dtype in DTYPES
        for shape, dim in [((3, 16), HEAD_DIM), ((2, 3, 24), HEAD_DIM), ((5, 7), 72)]
    ]


def no_seq_lens_cases() -> list[Case]:
    """Dense caches without seq_lens, default split: every sequence holds S_kv keys, split sized from shapes."""
    return [
        Case(f"dense-no-seq-lens-{dtype}-H{heads}", dtype=dtype, lens=[333, 333], num_heads=heads, with_seq_lens=False)
        for dtype, heads in [("bf16", 16), ("fp16", 128), ("fp32", 16)]
    ]


def mid_rows_sm90_cases() -> list[Case]:
    """17-32 rows on Hopper: the sm_90a kernel with most of each 64-row tile empty, planned for it with seq_lens
    (work items) and, with 16-key pages, walked by the portable 32-row kernel as ranges instead."""
    return [
        Case("h17to32-bf16-H24-dense", lens=[200, 0, 37], num_heads=24),
        Case("h17to32-fp16-H32-page64-combine", dtype="fp16", lens=[130, 5], num_heads=32, page_size=64,
             kv_len_per_split=64),  # fmt: skip
        Case("h17to32-bf16-H16-Sq2-dense", lens=[150, 3], num_heads=16, seqlen_q=2, causal=True),
        Case("balanced-items-h17to32-bf16-H32-page64", lens=SHORT_LENS, num_heads=32, page_size=64),
        Case(
            "balanced-items-as-ranges-h17to32-fp16-H32-page16",
            dtype="fp16",
            lens=SHORT_LENS,
            num_heads=32,
            page_size=16,
        ),
    ]


def kernel_cases() -> list[Case]:
    """One case per kernel variant, as small as keeps its loops honest (several key tiles, a partial last tile)."""
    return [
        Case("dim-split-few-rows-bf16-1split", lens=[100], num_heads=16),
        Case(
            "dim-split-few-rows-fp16-combine-page16",
            dtype="fp16",
            lens=[100, 37],
            num_heads=8,
            page_size=16,
            kv_len_per_split=32,
        ),
        Case("dim-split-few-rows-bf16-big-grid", lens=[300] * 8, num_heads=16, kv_len_per_split=16),
        *cluster_merge_cases(),
        Case("dim-split-mid-rows-fp16", dtype="fp16", lens=[150], num_heads=32, kv_len_per_split=32),
        Case("dim-split-mid-rows-bf16-Sq2", lens=[90, 3], num_heads=16, seqlen_q=2, causal=True, page_size=1),
        Case("key-split-64-rows-bf16-page16", lens=[70], num_heads=128, page_size=16),
        Case(
            "key-split-64-rows-fp16-Sq2-page1",
            dtype="fp16",
            lens=[50],
            num_heads=64,
            seqlen_q=2,
            causal=True,
            page_size=1,
            kv_len_per_split=32,
        ),
        Case("tf32-fp32-H16-combine", dtype="fp32", lens=[90], num_heads=16, kv_len_per_split=32),
        Case("tf32-fp32-H128-page64", dtype="fp32", lens=[130], num_heads=128, page_size=64),
        Case("h64plus-bf16-H128-dense", lens=[200], num_heads=128),
        Case("h64plus-bf16-H64-page64-combine", lens=[130, 5], num_heads=64, page_size=64, kv_len_per_split=64),
        Case(
            "h64plus-fp16-H128-page64-Sq2",
            dtype="fp16",
            lens=[100],
            num_heads=128,
            seqlen_q=2,
            causal=True,
            page_size=64,
        ),
        Case("merge-states-bf16", lens=[3, 16], num_heads=HEAD_DIM, op="merge_states"),
        *no_seq_lens_cases()[:2],
        *mid_rows_sm90_cases(),
        *balanced_cases(),
    ]


def balanced_cases() -> list[Case]:
    """Balanced splits over many short sequences and a long one. Few rows: CTAs walk several sequences of their
    range, reusing shared memory between them. Many rows: one work item per CTA, spare items included, from the
    planner kernel's table (a warp up to 32 sequences, a CTA above; also with the long sequences cut into one wave,
    and a batch wider than the planner's CTA) or, for one sequence, planned per CTA. On Hopper, batches of a third to
    a half of a wave's items run their items in clusters of two, each two-piece sequence merged there: 24 sequences
    at 128 heads (the planner's warp) and 50 at 64 heads (its CTA), mostly two pieces of 64 keys, with a 5-piece
    sequence whose items straddle clusters and one-piece and empty ones behind."""
    short_16 = [(i * 7) % 23 for i in range(600)] + [2000]
    one_wave = [8192, 8155] + [(i * 7) % 97 + 2 for i in range(60)]
    return [
        Case("balanced-ranges-dim-split-bf16-page16", lens=short_16, num_heads=16, page_size=16),
        Case("balanced-ranges-tf32-fp32-page16", dtype="fp32", lens=short_16[300:], num_heads=16, page_size=16),
        Case("balanced-items-key-split-fp16-page16", dtype="fp16", lens=SHORT_LENS, num_heads=128, page_size=16),
        Case("balanced-items-h64plus-bf16-page64", lens=SHORT_LENS, num_heads=128, page_size=64),
        Case("balanced-items-one-wave-bf16-page64", lens=one_wave, num_heads=128, page_size=64),
        Case("balanced-items-planner-600-bf16-page64", lens=short_16, num_heads=128, page_size=64),
        Case("balanced-items-one-sequence-bf16-page64", lens=[5003], num_heads=128, page_size=64),
        Case("balanced-items-seven-sequences-bf16-page64", lens=[3000, 17, 0, 1200, 5, 64, 999], num_heads=128,
             page_size=64),
        Case("balanced-items-pairs-warp-planner-bf16", lens=[130] * 20 + [300, 0, 65, 7], num_heads=128),
        Case("balanced-items-pairs-planner-cta-fp16-page64", dtype="fp16",
             lens=[130] * 40 + [300] * 4 + [0, 3, 65, 1, 20, 9], num_heads=64, page_size=64),  # fmt: skip
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subset", choices=["all", "kernels"], default="all")
    parser.add_argument("--list", action="store_true", help="print the case names and exit")
    parser.add_argument("--only", default=None, help="run only the cases whose name contains this text")
    args = parser.parse_args()
    cases = full_matrix() if args.subset == "all" else kernel_cases()
    if args.only:
        cases = [case for case in cases if args.only in case.name]
    if args.list:
        print("\n".join(case.name for case in cases))
        return 0
    if not torch.cuda.is_available():
        print("sanitize_cases: no CUDA device", file=sys.stderr)
        return 2
    failed = []
    began = time.perf_counter()
    for number, case in enumerate(cases, 1):
        print(f"[{number}/{len(cases)}] {case.name}", flush=True)
        try:
            run_case(case)
        except Exception:  # keep going: the sanitizer log should cover every case
            failed.append(case.name)
            traceback.print_exc()
    elapsed = time.perf_counter() - began
    print(
        f"sanitize_cases: {len(cases)} cases ({args.subset}) in {elapsed:.1f} s, {len(failed)} failed"
        + (f": {', '.join(failed)}" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
