"""`python3 -m benchmarks.bench --ragged`: a ragged batch (a few long sequences among many short ones) against a
uniform batch of the same B, H and total tokens, timed as the main grid is (BENCH.md: L layers in one CUDA graph,
median replay).

Both batches use the serving layout: one pool of 64-token pages per layer, pages handed out in shuffled order, an
int32 block table and seq_lens on the device; the block table is as wide as the longest sequence. The figure to
watch is ragged / uniform time: a decode whose work follows the tokens keeps it near 1.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

import torch

import mla_ext
from benchmarks.common import KEY_DIM, decode_bytes, format_rate
from mla_ext import HEAD_DIM

PAGE_SIZE = 64
LAYER_BUDGET = {"cuda": 1.5e9, "cpu": 128e6}  # as bench.py: distinct caches per timed pass
MAX_LAYERS = {"cuda": 128, "cpu": 32}
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 2e-3}  # max|out - ref| / max|ref|, as bench.py


@dataclass(frozen=True)
class Scenario:
    heads: int
    long_count: int  # sequences of long_len keys, spread over the batch
    long_len: int
    short_count: int  # sequences of short_len keys
    short_len: int

    @property
    def batch(self):
        return self.long_count + self.short_count

    def ragged_lens(self):
        lens = [self.short_len] * self.batch
        stride = self.batch // self.long_count
        for i in range(self.long_count):
            lens[i * stride] = self.long_len
        return lens

    def uniform_lens(self):
        """Same B and total tokens, spread evenly (the first few one token longer when it does not divide)."""
        total = sum(self.ragged_lens())
        return [total // self.batch + (1 if b < total % self.batch else 0) for b in range(self.batch)]

    def label(self):
        return f"H={self.heads} B={self.batch}: {self.long_count} x {self.long_len} + {self.short_count} x " \
               f"{self.short_len}"  # fmt: skip


SCENARIOS = {
    "cuda": [
        Scenario(16, 4, 32768, 60, 512),
        Scenario(128, 4, 32768, 60, 512),
        Scenario(16, 8, 32768, 120, 512),
        Scenario(16, 1, 32768, 15, 512),
    ],
    "cpu": [Scenario(16, 2, 4096, 14, 256), Scenario(128, 1, 4096, 7, 256)],
}


def make_batch(lens, heads, dtype, num_layers, device, generator):
    """(queries [B, H, 576] per layer, pools [P, 64, 576] per layer, block_table [B, max_pages], seq_lens [B])."""
    used = [math.ceil(n / PAGE_SIZE) for n in lens]
    page_ids = list(range(sum(used)))
    random.Random(0).shuffle(page_ids)
    table, start = [], 0
    for count in used:
        table.append(page_ids[start : start + count] + [-1] * (max(used) - count))
        start += count
    block_table = torch.tensor(table, dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.float32).to(dtype)

    queries = [randn(len(lens), heads, KEY_DIM) for _ in range(num_layers)]
    pools = [randn(sum(used), PAGE_SIZE, KEY_DIM) for _ in range(num_layers)]
    return queries, pools, block_table, seq_lens


def num_layers(lens, dtype, device_type):
    cache_bytes = sum(lens) * KEY_DIM * dtype.itemsize
    return max(1, min(MAX_LAYERS[device_type], math.ceil(LAYER_BUDGET[device_type] / cache_bytes)))


def measure(lens, heads, dtype, device, time_method, reference, repeats, seed):
    """Times one batch; returns {us, gbps, layers, rel_err}."""
    layers = num_layers(lens, dtype, device.type)
    generator = torch.Generator(device=device).manual_seed(seed)
    queries, pools, block_table, seq_lens = make_batch(lens, heads, dtype, layers, device, generator)
    outs = [q.new_empty(q.shape[0], heads, HEAD_DIM) for q in queries]

    def run(i):
        q, pool = queries[i], pools[i]
        mla_ext.decode(q[..., :HEAD_DIM], q[..., HEAD_DIM:], pool[..., :HEAD_DIM], pool[..., HEAD_DIM:],
                       block_table=block_table, seq_lens=seq_lens, out=outs[i])  # fmt: skip
        return outs[i]

    us, out0 = time_method(run, layers, device, repeats)
    result = {"us": us, "gbps": decode_bytes(heads, lens, dtype.itemsize) / us / 1e3, "layers": layers}
    if reference is not None:  # the longest and the last sequence of layer 0
        rows = sorted({max(range(len(lens)), key=lens.__getitem__), len(lens) - 1})
        q, pool = queries[0][rows], pools[0]
        ref, _ = reference(q[..., :HEAD_DIM], q[..., HEAD_DIM:], pool[..., :HEAD_DIM], pool[..., HEAD_DIM:],
                           block_table=block_table[rows], seq_lens=seq_lens[rows])  # fmt: skip
        got = out0[rows].double().cpu()
        finite = bool(torch.isfinite(got).all())
        result["rel_err"] = ((got - ref).abs().max() / ref.abs().max()).item() if finite else math.inf
    return result


def run_ragged(args, device, time_method, reference, meta):
    """Runs every scenario for every --dtype; writes DIR/bench_ragged_<device>.json and .md. Returns an exit code."""
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    scenarios = [s for s in SCENARIOS[device.type] if not args.heads or s.heads in args.heads]
    records, failed = [], 0
    for dtype_name in args.dtypes:
        for index, scenario in enumerate(scenarios, 1):
            record = {"dtype": dtype_name, **vars(scenario), "batch": scenario.batch}
            for name, lens in (("ragged", scenario.ragged_lens()), ("uniform", scenario.uniform_lens())):
                record[name] = measure(lens, scenario.heads, dtypes[dtype_name], device, time_method, reference,
                                       args.repeats, seed=index)  # fmt: skip
                record[name]["max_len"] = max(lens)
                err = record[name].get("rel_err", 0.0)
                record[name]["check"] = "pass" if err <= TOLERANCE[dtype_name] else "FAIL"
                failed += record[name]["check"] != "pass"
            record["ratio"] = record["ragged"]["us"] / record["uniform"]["us"]
            records.append(record)
            print(f"[ragged {len(records)}/{len(args.dtypes) * len(scenarios)}] {dtype_name} {scenario.label()}: "
                  f"ragged {record['ragged']['us']:.1f} us, uniform {record['uniform']['us']:.1f} us, ratio "
                  f"{record['ratio']:.2f}", flush=True)  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"bench_ragged_{device.type}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": records}, indent=1))
    table = markdown(meta, records)
    stem.with_suffix(".md").write_text(table)
    print("\n" + table + f"wrote {stem.with_suffix('.json')}, {stem.with_suffix('.md')}")
    return 1 if failed else 0


def markdown(meta, records):
    lines = [
        f"# mla_ext ragged vs uniform batches ({meta['device']})",
        "",
        f"{meta['date']}; torch {meta['torch']}; timing: {meta['timing']}. Paged caches, {PAGE_SIZE}-token pages, "
        "seq_lens on the device; the uniform batch has the same B, H and total tokens. ratio = ragged / uniform "
        "time (1.15 or below: the ragged batch costs about what its tokens do). err = max|out - ref| / max|ref| on "
        "the longest and the last sequence.",
        "",
        "| dtype | H | B | ragged lengths | uniform length | ragged us | GB/s | uniform us | GB/s | ratio | err "
        "| check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        ragged, uniform = r["ragged"], r["uniform"]
        err = max(ragged.get("rel_err", 0.0), uniform.get("rel_err", 0.0))
        check = "pass" if ragged["check"] == uniform["check"] == "pass" else "FAIL"
        lines.append(
            f"| {r['dtype']} | {r['heads']} | {r['batch']} | {r['long_count']} x {r['long_len']} + {r['short_count']}"
            f" x {r['short_len']} | {uniform['max_len']} | {ragged['us']:.1f} | {format_rate(ragged['gbps'])} | "
            f"{uniform['us']:.1f} | {format_rate(uniform['gbps'])} | {r['ratio']:.2f} | {err:.1e} | {check} |"
        )
    return "\n".join(lines) + "\n"
