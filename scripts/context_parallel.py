#!/usr/bin/env python3
"""Context-parallel and head-parallel MLA decode across processes, checked against one device and timed.

    torchrun --nproc-per-node N -m scripts.context_parallel [--device cuda|cpu] [--batch 1,2,4,8]
             [--heads 16,128] [--seqlen 131072] [--dtype bf16] [--repeats 20] [--json FILE]

Context parallel (CP): each sequence's keys are cut into N contiguous chunks, chunk r on rank r (a rank's seq_lens
are its chunk lengths, possibly 0). Every rank decodes its chunk with decode_with_lse, out and lse are all-gathered
(NCCL on CUDA, gloo on CPU), and each rank merges the N partial results with merge_states, pairwise in rank order.
Head parallel (TP): every rank holds the whole cache and decodes H / N heads; an all-gather over heads gives the
full output.

Checks (rank 0): CP and TP against one decode of the whole cache on one device, with ragged lengths (one sequence
whose keys all sit on rank 0, one with no key), and against the float64 reference (tests/reference.py) on a slice.
Timing (every sequence full length): per decode step, after warm-up, CUDA events (wall clock on CPU), median over
--repeats; graph-free, so the CP and TP figures include the collective's launch and latency.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.reference import decode_reference  # the float64 reference; torch only

# Imported in main(), after the arguments, so --help works without a built extension: mla_ext (and its head dims),
# the timing helpers and the test suite's tolerances (both import mla_ext).
mla_ext = common = checks = None
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
REFERENCE_HEADS = 4  # heads of the float64 check (the reference is the slow part on the CPU)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--batch", type=_int_list, default=(1, 2, 4, 8), help="comma list of batch sizes")
    parser.add_argument("--heads", type=_int_list, default=(16, 128), help="comma list of head counts")
    parser.add_argument("--seqlen", type=_int_list, default=(131072,), help="comma list of cache lengths")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps; the median is reported")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--json", type=Path, help="also write the results here (rank 0)")
    return parser.parse_args(argv)


def _int_list(text):
    return tuple(int(v) for v in text.split(","))


def init_distributed(device_type):
    """(rank, world size, device); a plain `python` run is a world of one."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def all_gather(tensor):
    """[world, *tensor.shape]: every rank's tensor, gathered as raw bytes (gloo lacks some 16-bit float types)."""
    raw = tensor.contiguous().view(torch.uint8)
    world = dist.get_world_size()
    if dist.get_backend() == "nccl":
        gathered = raw.new_empty((world, *raw.shape))
        dist.all_gather_into_tensor(gathered, raw)
    else:
        parts = [torch.empty_like(raw) for _ in range(world)]
        dist.all_gather(parts, raw)
        gathered = torch.stack(parts)
    return gathered.view(tensor.dtype)


def merge_in_rank_order(outs, lses):
    """outs [N, B, H, D], lses [N, B, H] -> the merge of ranks 0, 1, ..., N - 1, pairwise in that order."""
    out, lse = outs[0], lses[0]
    for rank in range(1, outs.shape[0]):
        out, lse = mla_ext.merge_states(out, lse, outs[rank], lses[rank])
    return out, lse


def chunk_size(seqlen, world):
    return math.ceil(seqlen / world)


def ragged_lens(batch, seqlen, world):
    """Full, shorter, one inside rank 0's chunk, one empty (as the batch allows)."""
    lens = [seqlen - (seqlen * b) // (2 * batch) - 3 * b for b in range(batch)]
    if batch >= 2:
        lens[-1] = max(1, chunk_size(seqlen, world) // 2)  # every other rank holds none of its keys
    if batch >= 3:
        lens[1] = 0
    return torch.tensor(lens, dtype=torch.int32)


def shard_lens(lens, rank, world, seqlen):
    """This rank's share of each sequence's keys: the length of [rank * chunk, (rank + 1) * chunk) inside it."""
    chunk = chunk_size(seqlen, world)
    return (lens - rank * chunk).clamp(0, chunk).to(torch.int32)


class Case:
    """One (B, H, S) problem: queries and the whole cache on every rank (broadcast from rank 0)."""

    def __init__(self, batch, heads, seqlen, dtype, device, seed):
        generator = torch.Generator(device=device).manual_seed(seed)
        width = common.KEY_DIM
        self.q_full = torch.randn(batch, heads, width, generator=generator, device=device).to(dtype)  # [B, H, 576]
        self.cache = torch.randn(batch, seqlen, width, generator=generator, device=device).to(dtype)  # [B, S, 576]
        # Every rank holds the whole cache (the head-parallel run and the one-device check need it); the
        # context-parallel run reads only its rank's chunk of it.
        for tensor in (self.q_full, self.cache):
            dist.broadcast(tensor.view(torch.uint8), 0)  # raw bytes, as in all_gather

    def args(self, heads=slice(None), keys=slice(None)):
        """(q, q_pe, kv, k_pe) views for a slice of heads and of keys."""
        q, cache = self.q_full[:, heads], self.cache[:, keys]
        head_dim = mla_ext.HEAD_DIM
        return q[..., :head_dim], q[..., head_dim:], cache[..., :head_dim], cache[..., head_dim:]


def context_parallel_step(case, rank, world, lens_here):
    """Decode this rank's chunk, gather every rank's (out, lse), merge in rank order."""
    chunk = chunk_size(case.cache.shape[1], world)
    out, lse = torch.ops.mla.decode_with_lse(*case.args(keys=slice(rank * chunk, (rank + 1) * chunk)),
                                             seq_lens=lens_here)  # fmt: skip
    return merge_in_rank_order(all_gather(out), all_gather(lse))


def head_parallel_step(case, rank, world, lens):
    """Decode this rank's H / N heads over the whole cache; gather over heads."""
    per_rank = case.q_full.shape[1] // world
    out, lse = torch.ops.mla.decode_with_lse(*case.args(heads=slice(rank * per_rank, (rank + 1) * per_rank)),
                                             seq_lens=lens)  # fmt: skip
    return torch.cat(all_gather(out).unbind(0), dim=1), torch.cat(all_gather(lse).unbind(0), dim=1)


def compare(out, lse, want_out, want_lse, dtype):
    """(worst relative error of out per sequence, worst lse error where finite, empty rows exact)."""
    out, want_out = out.double().cpu(), want_out.double().cpu()
    lse, want_lse = lse.double().cpu(), want_lse.double().cpu()
    worst = max(checks.relative_error(out[b], want_out[b]) for b in range(out.shape[0]))
    empty = torch.isneginf(want_lse)
    exact_empty = bool(torch.isneginf(lse[empty]).all() and (out[empty] == 0).all())
    finite = ~empty
    lse_err = (lse[finite] - want_lse[finite]).abs().max().item() if finite.any() else 0.0
    ok = torch.isfinite(out).all() and exact_empty and worst <= checks.OUT_RTOL[dtype]
    ok = ok and lse_err <= checks.LSE_ATOL[dtype]
    return {"out_err": worst, "lse_err": lse_err, "ok": bool(ok)}


def check_against_float64(case, result, lens, reference, dtype):
    """The worst comparison of (out, lse) with the float64 reference over sequences 0 and B - 1, a few heads."""
    heads = slice(0, min(case.q_full.shape[1], REFERENCE_HEADS))
    worst = {"out_err": 0.0, "lse_err": 0.0, "ok": True}
    for b in sorted({0, case.q_full.shape[0] - 1}):
        one, visible = slice(b, b + 1), slice(0, int(lens[b]))  # the reference reads only the visible keys
        want = reference(*(t[one] for t in case.args(heads=heads, keys=visible)), seq_lens=lens[one])
        got = compare(result[0][one, heads], result[1][one, heads], *want, dtype)
        worst = {"out_err": max(worst["out_err"], got["out_err"]), "lse_err": max(worst["lse_err"], got["lse_err"]),
                 "ok": worst["ok"] and got["ok"]}  # fmt: skip
    return worst


def median_us(fn, device, repeats, warmup, together=True):
    """Median microseconds of fn() over `repeats` calls after `warmup`. With `together`, all ranks start each call
    at a barrier; without, the work is this rank's alone."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if together:
            dist.barrier()
        common.synchronize(device)
        samples.append(common.time_once_us(fn, device))
    return statistics.median(samples)


def run_case(batch, heads, seqlen, args, rank, world, device, reference, seed):
    dtype = DTYPES[args.dtype]
    case = Case(batch, heads, seqlen, dtype, device, seed)
    record = {"batch": batch, "heads": heads, "seqlen": seqlen, "dtype": args.dtype, "ranks": world}
    full = torch.full((batch,), seqlen, dtype=torch.int32, device=device)
    ragged = ragged_lens(batch, seqlen, world).to(device)
    tp_ok = heads % world == 0
    for name, lens in (("ragged", ragged), ("full", full)):
        cp = context_parallel_step(case, rank, world, shard_lens(lens, rank, world, seqlen))
        tp = head_parallel_step(case, rank, world, lens) if tp_ok else None
        if rank == 0:
            single = torch.ops.mla.decode_with_lse(*case.args(), seq_lens=lens)
            record[f"cp_vs_single_{name}"] = compare(*cp, *single, dtype)
            if tp is not None:
                record[f"tp_vs_single_{name}"] = compare(*tp, *single, dtype)
                record[f"tp_bitwise_{name}"] = bool(torch.equal(tp[0], single[0]) and torch.equal(tp[1], single[1]))
            if name == "ragged":  # float64 on the longest sequence and the last one, a few heads
                record["cp_vs_float64"] = check_against_float64(case, cp, lens, reference, dtype)
    times = {"cp": median_us(lambda: context_parallel_step(case, rank, world, shard_lens(full, rank, world, seqlen)),
                             device, args.repeats, args.warmup)}  # fmt: skip
    if tp_ok:
        times["tp"] = median_us(lambda: head_parallel_step(case, rank, world, full), device, args.repeats, args.warmup)
    # One device over the whole cache: rank 0 times it while the others wait at the barrier.
    if rank == 0:
        times["single"] = median_us(lambda: torch.ops.mla.decode_with_lse(*case.args(), seq_lens=full), device,
                                    args.repeats, args.warmup, together=False)  # fmt: skip
    dist.barrier()
    record["us"] = times
    return record


def summary_line(record):
    us = record["us"]
    checks = {k: v for k, v in record.items() if isinstance(v, dict) and "ok" in v}
    worst = max(v["out_err"] for v in checks.values())
    verdict = "PASS" if all(v["ok"] for v in checks.values()) else "FAIL"
    tp = f"{us['tp']:9.1f} ({us['single'] / us['tp']:.2f}x)" if "tp" in us else "      n/a"
    return (f"| {record['dtype']} | {record['batch']} | {record['heads']} | {record['seqlen']} | {record['ranks']} | "
            f"{us['single']:.1f} | {us['cp']:.1f} ({us['single'] / us['cp']:.2f}x) | {tp} | {worst:.1e} | "
            f"{verdict} |")  # fmt: skip


def main(argv=None):
    global mla_ext, common, checks
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA is not available here; use --device cpu (gloo)")
    import mla_ext
    from benchmarks import common
    from tests.support import checks

    rank, world, device = init_distributed(args.device)
    reference = decode_reference if rank == 0 else None
    if rank == 0:
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        print(f"context / head parallel decode on {world} x {where} ({dist.get_backend()}), {args.dtype}", flush=True)
        print("| dtype | B | H | S | ranks | 1 device us | CP us (speedup) | TP us (speedup) | worst err | check |")
        print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    records = []
    configs = [(b, h, s) for s in args.seqlen for h in args.heads for b in args.batch]
    for index, (batch, heads, seqlen) in enumerate(configs):
        record = run_case(batch, heads, seqlen, args, rank, world, device, reference, seed=index)
        if rank == 0:
            records.append(record)
            print(summary_line(record), flush=True)
    failed = [r for r in records if not all(v["ok"] for v in r.values() if isinstance(v, dict) and "ok" in v)]
    if rank == 0:
        if args.json:
            args.json.write_text(json.dumps(records, indent=1))
        print("FAIL" if failed else "PASS", f"({len(records) - len(failed)} of {len(records)} configs checked out)")
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
