#!/usr/bin/env python3
"""Benchmark mla_ext.decode on the absorbed-MLA decode workload, next to every peer available in the same run.

    python3 -m benchmarks.bench [--quick] [--device cuda|cpu] [--dtype bf16[,fp16,fp32|all]] [--out-dir DIR]
                                [--batch 1,16] [--heads 16] [--seqlen 16384] [--kv-len-per-split N]
                                [--seqlen-q 2] [--ragged-lens] [--page-size N]
    python3 -m benchmarks.bench --ragged [--device cuda|cpu] [--heads 16,128]   (benchmarks/bench_ragged.py)

Run from the repository root (it imports mla_ext, benchmarks.common and tests.reference from there).

Workload: D=512, Dpe=64, one query token (--seqlen-q 2: two, causal), every sequence full length S (--ragged-lens:
lengths spread over [S/4, S] in the same cache), one [B, S, 576] cache per layer (latent kv in the first 512 values,
k_pe in the last 64, as serving frameworks store it) and one [B, H, 576] query ([B, S_q, H, 576] for S_q > 1).

CUDA: L distinct layers (L = clamp(ceil(1.5 GB / cache bytes), 1, 128)) are captured back to back in one CUDA
graph per method; the graph is replayed for ~100 ms to let the clock ramp, then timed with CUDA events. The figure
is the median of 5 replays divided by L, so host launch cost and L2 reuse stay out of it. A 2 GiB device copy
(read + write bytes) and a bf16 8192^3 matmul, measured in the same run, give the ceilings.

CPU: the same layered loop, timed with the wall clock (no graphs), mla_ext's CPU kernel against PyTorch eager.

Peers: PyTorch eager (bmm + softmax + bmm) always; FlashMLA and FlashInfer when installed (64-token pages over
the same memory). Every method's output is checked against the float64 reference (tests/reference.py) on the
first and last sequence of the batch. Results go to DIR/bench_<device>.json, .md and one .png per dtype.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

# Set by import_project() after argument parsing, so that --help works without a built extension; the head dims
# (common.HEAD_DIM, ROPE_DIM, KEY_DIM) come from mla_ext through common, so they too are read at run time.
mla_ext = None
common = None

REPO = Path(__file__).resolve().parents[1]
DTYPE_NAMES = ("bf16", "fp16", "fp32")

# The full grid; fp16 and fp32 run on SUBSET, the configs with published peer figures. Tuples are (B, H, S).
GRID_HEADS, GRID_BATCH, GRID_SEQLEN = (16, 128), (1, 16, 64, 128), (1024, 4096, 16384)
SUBSET = (
    (1, 16, 1024), (1, 16, 16384), (16, 16, 4096), (64, 16, 16384), (128, 16, 4096),
    (128, 16, 16384), (1, 128, 16384), (16, 128, 16384), (64, 128, 4096), (128, 128, 16384),
)  # fmt: skip
QUICK = ((1, 16, 16384), (16, 16, 4096), (128, 16, 16384), (16, 128, 16384), (64, 128, 4096))
CPU_HEADS, CPU_BATCH, CPU_SEQLEN = (16, 128), (1, 4), (1024, 4096)
CPU_QUICK = ((1, 16, 4096), (4, 128, 1024))

# Bytes of distinct caches per timed pass: far above the last-level cache, so every layer reads from memory.
LAYER_BUDGET = {"cuda": 1.5e9, "cpu": 128e6}
MAX_LAYERS = {"cuda": 128, "cpu": 32}
# Passing bound on max|out - ref| / max|ref| (fp32 allows TF32-rounded tensor-core inputs).
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 2e-3}
# "mla_ext_paged" is the call serving engines make: the same memory as 64-token pages of one [P, 64, 576] cache,
# a block table and device seq_lens (full length), as FlashMLA and FlashInfer are given, with the plan made once
# (mla_ext.plan), as FlashMLA's metadata is; the serving ratios compare the peers with it. Not default peers:
# "mla_ext_paged_per_call" (the same call planning per layer), "mla_ext_seq_lens" (the dense call with seq_lens) and
# "mla_ext_fp8" / "mla_ext_fp8_block" (the serving call on the cache stored in float8_e4m3fn: vLLM's 576-byte key with
# one scale, FlashMLA's 656-byte key with a scale per 128 values).
PEERS = (
    "eager", "mla_ext_paged", "flashmla", "flashinfer", "mla_ext_paged_per_call", "mla_ext_seq_lens", "mla_ext_fp8",
    "mla_ext_fp8_block",
)  # fmt: skip
DEFAULT_PEERS = ("eager", "mla_ext_paged", "flashmla", "flashinfer")
SERVING = "mla_ext_paged"
PEER_LABELS = {
    "mla_ext": "mla_ext",
    "eager": "PyTorch eager",
    "mla_ext_paged": "mla_ext paged",
    "mla_ext_paged_per_call": "mla_ext paged, planned per call",
    "flashmla": "FlashMLA",
    "flashinfer": "FlashInfer",
    "mla_ext_seq_lens": "mla_ext with seq_lens",
    "mla_ext_fp8": "mla_ext paged fp8",
    "mla_ext_fp8_block": "mla_ext paged fp8 per block",
}
FLASH_PAGE_SIZE = 64  # FlashMLA's only page size; FlashInfer uses the same pages


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Benchmark mla_ext.decode (absorbed MLA decode, D=512, Dpe=64) against PyTorch eager and, "
        "when installed, FlashMLA and FlashInfer.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where to run")
    parser.add_argument("--dtype", default="bf16", help="comma list of bf16, fp16, fp32, or 'all'")
    parser.add_argument("--quick", action="store_true", help="a handful of configs (about a minute on a GPU)")
    parser.add_argument("--batch", type=_int_list, help="override the grid's batch sizes, e.g. 1,16")
    parser.add_argument("--heads", type=_int_list, help="override the grid's head counts, e.g. 16,128")
    parser.add_argument("--seqlen", type=_int_list, help="override the grid's sequence lengths, e.g. 4096")
    parser.add_argument(
        "--peers", default=",".join(DEFAULT_PEERS), help=f"comma list of {','.join(PEERS)} (empty: none)"
    )
    parser.add_argument(
        "--peer-path", type=Path, action="append", default=[],
        help="folder holding a peer's prebuilt module (FlashMLA's flashmla_dense), searched before installed packages",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, help="CPU threads for both methods (default: torch's choice)")
    parser.add_argument(
        "--kv-len-per-split", type=int, help="fixed split size for mla_ext (default: its own choice from the shapes)"
    )
    parser.add_argument(
        "--page-size", type=int, default=64,
        help="keys per page of mla_ext's paged calls, viewing the same memory (FlashMLA and FlashInfer keep 64)",
    )  # fmt: skip
    parser.add_argument("--seqlen-q", type=int, default=1, help="query tokens per sequence (above 1: causal)")
    parser.add_argument(
        "--ragged-lens", action="store_true",
        help="seq_lens spread over [S/4, S] (every method gets them; the grid's S is the cache's capacity)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per method; the median is reported")
    parser.add_argument("--out-dir", type=Path, default=Path("bench_out"), help="where results are written")
    parser.add_argument("--ragged", action="store_true", help="instead of the grid: ragged vs uniform batches of the "
                        "same total tokens (benchmarks/bench_ragged.py)")  # fmt: skip
    args = parser.parse_args(argv)
    args.dtypes = DTYPE_NAMES if args.dtype == "all" else tuple(args.dtype.split(","))
    for name in args.dtypes:
        if name not in DTYPE_NAMES:
            parser.error(f"--dtype: expected bf16, fp16, fp32 or all, got {name!r}")
    if args.seqlen_q < 1:
        parser.error(f"--seqlen-q: expected a positive integer, got {args.seqlen_q}")
    if args.page_size < 1:
        parser.error(f"--page-size: expected a positive integer, got {args.page_size}")
    args.peers = tuple(p for p in args.peers.split(",") if p)
    for name in args.peers:
        if name not in PEERS:
            parser.error(f"--peers: expected names from {','.join(PEERS)}, got {name!r}")
    return args


def _int_list(text):
    return tuple(int(v) for v in text.split(","))


def plan_configs(args, dtype_name):
    """(B, H, S) tuples for one dtype, ordered H, then B, then S (one plot line per (B, H))."""
    if args.device == "cpu":
        full = [(b, h, s) for h in CPU_HEADS for b in CPU_BATCH for s in CPU_SEQLEN]
        configs = list(CPU_QUICK) if args.quick else full
    elif args.quick:
        configs = list(QUICK)
    elif dtype_name == "bf16":
        configs = [(b, h, s) for h in GRID_HEADS for b in GRID_BATCH for s in GRID_SEQLEN]
    else:
        configs = list(SUBSET)
    if args.batch or args.heads or args.seqlen:  # explicit axes replace the grid
        configs = [
            (b, h, s)
            for h in args.heads or sorted({c[1] for c in configs})
            for b in args.batch or sorted({c[0] for c in configs})
            for s in args.seqlen or sorted({c[2] for c in configs})
        ]
    return sorted(set(configs), key=lambda c: (c[1], c[0], c[2]))


@dataclass(frozen=True)
class Workload:
    dtype_name: str
    batch: int
    heads: int
    seqlen: int  # the cache's capacity; every sequence's length unless ragged
    seqlen_q: int = 1  # above 1: causal
    ragged: bool = False

    @property
    def causal(self):
        return self.seqlen_q > 1

    @property
    def lens(self):
        """Each sequence's length: S, or (ragged) spread over [S/4, S] by a fixed low-discrepancy sequence."""
        if not self.ragged:
            return [self.seqlen] * self.batch
        spread = [1 - 0.75 * ((b * 0.6180339887) % 1) for b in range(self.batch)]
        return [max(self.seqlen_q, round(self.seqlen * f)) for f in spread]

    @property
    def dtype(self):
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.dtype_name]

    @property
    def cache_bytes(self):
        return self.batch * self.seqlen * common.KEY_DIM * self.dtype.itemsize

    @property
    def bytes(self):
        return common.decode_bytes(self.heads * self.seqlen_q, self.lens, self.dtype.itemsize)  # S_q * H query rows

    def bytes_with_keys_of(self, key_bytes):
        """Bytes of the call when each cached key takes key_bytes (an fp8 cache) instead of 576 values of dtype."""
        return self.bytes + sum(self.lens) * (key_bytes - common.KEY_DIM * self.dtype.itemsize)

    @property
    def flops(self):
        # token t of S_q sees len - (S_q - 1 - t) keys (bottom-right causal)
        return sum(
            common.decode_flops(self.heads, [n - (self.seqlen_q - 1 - t) for n in self.lens])
            for t in range(self.seqlen_q)
        )

    def num_layers(self, device_type):
        layers = math.ceil(LAYER_BUDGET[device_type] / self.cache_bytes)
        return max(1, min(MAX_LAYERS[device_type], layers))


@dataclass
class Layer:
    """One layer's inputs; every method reads the same memory through views."""

    q_full: torch.Tensor  # [B, H, 576] ([B, S_q, H, 576]): latent query (first 512) and rope query (last 64)
    cache: torch.Tensor  # [B, S, 576]: latent kv (first 512) and k_pe (last 64)

    @property
    def q(self):
        return self.q_full[..., : common.HEAD_DIM]  # [B, (S_q,) H, 512]

    @property
    def q_pe(self):
        return self.q_full[..., common.HEAD_DIM :]  # [B, (S_q,) H, 64]

    @property
    def kv(self):
        return self.cache[..., : common.HEAD_DIM]  # [B, S, 512]

    @property
    def k_pe(self):
        return self.cache[..., common.HEAD_DIM :]  # [B, S, 64]


def make_layers(work, count, device, generator):
    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.float32).to(work.dtype)

    query = (work.batch, work.heads) if work.seqlen_q == 1 else (work.batch, work.seqlen_q, work.heads)
    width = common.KEY_DIM
    return [Layer(randn(*query, width), randn(work.batch, work.seqlen, width)) for _ in range(count)]


class Unavailable(Exception):
    """A peer that cannot run here (not installed, or no kernel for this dtype / shape)."""


# Each builder returns run(i) -> out [B, H, 512] for layer i; setup that a serving loop does once per batch
# (allocation, scheduling metadata, plans) happens in the builder, outside the timed region.


def build_mla_ext(work, layers, sm_scale, with_seq_lens=False, kv_len_per_split=None):
    outs = [torch.empty_like(layer.q_full[..., : common.HEAD_DIM]) for layer in layers]  # [B, (S_q,) H, 512] each
    seq_lens = None
    # ragged lengths need seq_lens; at full lengths they change only the split choice, not the keys
    if with_seq_lens or work.ragged:
        seq_lens = _seq_lens(work, layers[0].cache.device)

    def run(i):
        layer = layers[i]
        mla_ext.decode(
            layer.q, layer.q_pe, layer.kv, layer.k_pe, sm_scale=sm_scale, kv_len_per_split=kv_len_per_split,
            seq_lens=seq_lens, causal=work.causal, out=outs[i],
        )  # fmt: skip
        return outs[i]

    return run


def build_mla_ext_paged(work, layers, sm_scale, planned=True, page_size=FLASH_PAGE_SIZE):
    if work.seqlen % page_size:
        raise Unavailable(f"S must be a multiple of {page_size}")
    block_table, seq_lens = _page_tables(work, layers[0].cache.device, page_size)
    outs = [torch.empty_like(layer.q_full[..., : common.HEAD_DIM]) for layer in layers]  # [B, (S_q,) H, 512] each
    pages = [layer.cache.view(-1, page_size, common.KEY_DIM) for layer in layers]  # [P, page_size, 576]

    def arguments(i):
        layer, cache = layers[i], pages[i]
        return (layer.q, layer.q_pe, cache[..., :common.HEAD_DIM], cache[..., common.HEAD_DIM:]), dict(
            sm_scale=sm_scale, block_table=block_table, seq_lens=seq_lens, causal=work.causal
        )  # fmt: skip

    args, kwargs = arguments(0)
    plan = mla_ext.plan(*args, **kwargs) if planned else None

    def run(i):
        args, kwargs = arguments(i)
        mla_ext.decode(*args, **kwargs, plan=plan, out=outs[i])
        return outs[i]

    return run


FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
FP8_BLOCK = 128  # kv values under one scale in the per-block layout


def build_mla_ext_fp8(work, layers, sm_scale, per_block=False):
    """The serving call on each layer's cache stored in fp8 (64-token pages, device seq_lens). Its reference is that
    of the dequantised cache, and its bytes are those of the fp8 keys."""
    if work.dtype_name == "fp32":
        raise Unavailable("fp8 caches take fp16 or bf16 queries")
    if work.seqlen % FLASH_PAGE_SIZE:
        raise Unavailable(f"S must be a multiple of {FLASH_PAGE_SIZE}")
    block_table, seq_lens = _page_tables(work, layers[0].cache.device)
    caches = [_fp8_pages(layer, per_block) for layer in layers]  # (kv, k_pe, kv_scale) each
    outs = [torch.empty_like(layer.q_full[..., : common.HEAD_DIM]) for layer in layers]

    def run(i):
        kv, k_pe, kv_scale = caches[i]
        mla_ext.decode(
            layers[i].q, layers[i].q_pe, kv, k_pe, sm_scale=sm_scale, kv_scale=kv_scale, block_table=block_table,
            seq_lens=seq_lens, causal=work.causal, out=outs[i],
        )  # fmt: skip
        return outs[i]

    def cache_rows(rows):
        """Layer 0's fp8 kv, k_pe and kv_scale of sequences `rows`, dense (a sequence's pages are consecutive)."""
        pages = work.seqlen // FLASH_PAGE_SIZE
        return tuple(
            t if t.dim() == 1 else torch.stack([t[b * pages : (b + 1) * pages].flatten(0, 1) for b in rows])
            for t in caches[0]
        )  # fmt: skip

    run.reference_slice = lambda reference: reference_slice(reference, work, layers[0], sm_scale, cache_rows)
    run.key_bytes = common.HEAD_DIM + (4 * 4 + common.ROPE_DIM * work.dtype.itemsize if per_block else common.ROPE_DIM)
    return run


def _fp8_pages(layer, per_block):
    """(kv, k_pe, kv_scale) of the layer's cache in fp8 as [P, 64, ...] pages: per tensor one 576-byte buffer per key
    and one scale (amax / 448); per block FlashMLA's 656-byte key: 512 e4m3 values, 4 float32 scales (one per 128
    values), the 64 rope values in q's dtype."""
    dtype = layer.cache.dtype
    cache = layer.cache.reshape(-1, common.KEY_DIM)  # [B * S, 576]
    keys = cache.shape[0]
    if not per_block:
        scale = (cache.abs().amax().float() / FP8_MAX).clamp_min(1e-12).reshape(1)
        pages = (cache.float() / scale).to(FP8).view(-1, FLASH_PAGE_SIZE, common.KEY_DIM)
        return pages[..., : common.HEAD_DIM], pages[..., common.HEAD_DIM :], scale
    width = common.HEAD_DIM + 4 * 4 + common.ROPE_DIM * dtype.itemsize
    buffer = torch.empty(keys, width, dtype=torch.uint8, device=cache.device)
    blocks = cache[:, : common.HEAD_DIM].float().reshape(keys, -1, FP8_BLOCK)
    scale = (blocks.abs().amax(-1) / FP8_MAX).clamp_min(1e-12)  # [keys, 4]
    buffer[:, common.HEAD_DIM : common.HEAD_DIM + 16].view(torch.float32).copy_(scale)
    buffer[:, : common.HEAD_DIM].view(FP8).copy_((blocks / scale[..., None]).reshape(keys, -1).to(FP8))
    buffer[:, common.HEAD_DIM + 16 :].view(dtype).copy_(cache[:, common.HEAD_DIM :])
    pages = buffer.view(-1, FLASH_PAGE_SIZE, width)
    return (
        pages[..., : common.HEAD_DIM].view(FP8),
        pages[..., common.HEAD_DIM + 16 :].view(dtype),
        pages[..., common.HEAD_DIM : common.HEAD_DIM + 16].view(torch.float32),
    )


def _page_tables(work, device, page_size=FLASH_PAGE_SIZE):
    """Block table [B, S / page_size] (sequence b owns pages b * S / page_size onwards) and int32 seq_lens [B]."""
    pages_per_seq = work.seqlen // page_size
    block_table = torch.arange(work.batch * pages_per_seq, dtype=torch.int32, device=device)
    return block_table.view(work.batch, pages_per_seq), _seq_lens(work, device)


def _seq_lens(work, device):
    return torch.tensor(work.lens, dtype=torch.int32, device=device)


def _query_tokens(work, layers):
    """Queries [B, S_q, H, 576] as FlashMLA takes them, and how to shape its [B, S_q, H, 512] output like mla_ext's."""
    queries = [layer.q_full if work.seqlen_q > 1 else layer.q_full.unsqueeze(1) for layer in layers]
    return queries, (lambda out: out) if work.seqlen_q > 1 else (lambda out: out.squeeze(1))


def _require_one_token_full_lengths(work):
    if work.seqlen_q > 1 or work.ragged:
        raise Unavailable("one query token and full lengths only")


def build_eager(work, layers, sm_scale):
    _require_one_token_full_lengths(work)

    def run(i):
        layer = layers[i]
        scores = torch.bmm(layer.q_full, layer.cache.transpose(1, 2))  # [B, H, S]
        probs = torch.softmax(scores.float() * sm_scale, dim=-1).to(layer.cache.dtype)
        return torch.bmm(probs, layer.kv)  # [B, H, 512]

    return run


def build_flashmla(work, layers, sm_scale):
    try:
        from flash_mla import flash_mla_with_kvcache, get_mla_metadata
    except ImportError:
        return build_flashmla_dense(work, layers, sm_scale)
    _require_flash_shapes(work)
    block_table, seq_lens = _page_tables(work, layers[0].cache.device)
    # Older releases take (seq_lens, s_q * h_q / h_kv, h_kv); newer ones ignore the arguments and fill the
    # returned metadata on the first call, which the warm-up call before capture makes.
    metadata, num_splits = get_mla_metadata(seq_lens, work.seqlen_q * work.heads, 1)
    queries, shape_out = _query_tokens(work, layers)  # [B, S_q, H, 576]
    caches = [layer.cache.view(-1, FLASH_PAGE_SIZE, 1, common.KEY_DIM) for layer in layers]  # [P, 64, 1, 576]

    def run(i):
        out, _ = flash_mla_with_kvcache(
            queries[i], caches[i], block_table, seq_lens, common.HEAD_DIM, metadata, num_splits,
            softmax_scale=sm_scale, causal=work.causal,
        )  # fmt: skip
        return shape_out(out)

    return run


def build_flashmla_dense(work, layers, sm_scale):
    """FlashMLA's dense decode as a prebuilt module (flashmla_dense, found through --peer-path): its scheduling
    metadata is computed once, as engines do once per step, and passed to every layer's call."""
    try:
        import flashmla_dense
    except ImportError as error:
        raise Unavailable(f"neither flash_mla nor flashmla_dense imports ({error})") from None
    _require_flash_shapes(work)
    if work.dtype_name != "bf16":
        raise Unavailable("prebuilt for bf16 only")
    block_table, seq_lens = _page_tables(work, layers[0].cache.device)
    queries, shape_out = _query_tokens(work, layers)  # [B, S_q, H, 576]
    caches = [layer.cache.view(-1, FLASH_PAGE_SIZE, 1, common.KEY_DIM) for layer in layers]  # [P, 64, 1, 576]
    _, _, metadata, num_splits = flashmla_dense.dense_decode_fwd(
        queries[0], caches[0], common.HEAD_DIM, seq_lens, block_table, sm_scale, work.causal, None, None
    )

    def run(i):
        out, _, _, _ = flashmla_dense.dense_decode_fwd(
            queries[i], caches[i], common.HEAD_DIM, seq_lens, block_table, sm_scale, work.causal, metadata, num_splits
        )
        return shape_out(out)

    return run


def build_flashinfer(work, layers, sm_scale):
    try:
        from flashinfer.mla import BatchMLAPagedAttentionWrapper
    except ImportError:
        raise Unavailable("not installed") from None
    _require_flash_shapes(work)
    _require_one_token_full_lengths(work)
    device = layers[0].cache.device
    pages_per_seq = work.seqlen // FLASH_PAGE_SIZE

    def int32(values):
        return values.to(device=device, dtype=torch.int32)

    qo_indptr = int32(torch.arange(work.batch + 1))  # [B + 1]: one query token per sequence
    kv_indptr = int32(torch.arange(work.batch + 1) * pages_per_seq)  # [B + 1]
    kv_indices = int32(torch.arange(work.batch * pages_per_seq))  # [B * S / 64]
    kv_lens = int32(torch.full((work.batch,), work.seqlen))  # [B]
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    wrapper = BatchMLAPagedAttentionWrapper(
        workspace, use_cuda_graph=True, qo_indptr=torch.empty_like(qo_indptr), kv_indptr=torch.empty_like(kv_indptr),
        kv_indices=torch.empty_like(kv_indices), kv_len_arr=torch.empty_like(kv_lens),
    )  # fmt: skip
    wrapper.plan(
        qo_indptr, kv_indptr, kv_indices, kv_lens, work.heads, common.HEAD_DIM, common.ROPE_DIM, FLASH_PAGE_SIZE,
        False, sm_scale, work.dtype, work.dtype,
    )  # fmt: skip
    q_nope = [layer.q.contiguous() for layer in layers]  # [B, H, 512]
    q_pe = [layer.q_pe.contiguous() for layer in layers]  # [B, H, 64]
    paged = [layer.cache.view(-1, FLASH_PAGE_SIZE, common.KEY_DIM) for layer in layers]  # [P, 64, 576]

    def run(i):
        return wrapper.run(q_nope[i], q_pe[i], paged[i][..., : common.HEAD_DIM], paged[i][..., common.HEAD_DIM :])

    return run


def _require_flash_shapes(work):
    if work.dtype_name == "fp32":
        raise Unavailable("no fp32 kernel")
    if work.seqlen % FLASH_PAGE_SIZE:
        raise Unavailable(f"S must be a multiple of {FLASH_PAGE_SIZE}")


BUILDERS = {
    "mla_ext": build_mla_ext,
    "eager": build_eager,
    "mla_ext_paged": build_mla_ext_paged,
    "flashmla": build_flashmla,
    "flashinfer": build_flashinfer,
    "mla_ext_paged_per_call": functools.partial(build_mla_ext_paged, planned=False),
    "mla_ext_seq_lens": functools.partial(build_mla_ext, with_seq_lens=True),
    "mla_ext_fp8": build_mla_ext_fp8,
    "mla_ext_fp8_block": functools.partial(build_mla_ext_fp8, per_block=True),
}


def time_method(run, num_layers, device, repeats):
    """(microseconds per layer, layer 0's output). CUDA: one graph over all layers; CPU: a plain loop."""
    if device.type == "cpu":
        out0 = run(0)
        us = common.median_us(lambda: [run(i) for i in range(num_layers)], device, repeats, warmup_s=0.0)
        return us / num_layers, out0
    # Warm up outside capture, on a side stream as torch.cuda.graphs asks: lazy init (handles, JIT, metadata).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [run(i) for i in range(num_layers)]  # kept alive: layer 0's output is checked after the replays
    us = common.median_us(graph.replay, device, repeats, warmup_s=0.1)
    return us / num_layers, outs[0]


def load_reference():
    """The float64 reference of the test suite, or None where the tests are not beside the benchmarks."""
    try:
        from tests.reference import decode_reference
    except ModuleNotFoundError:
        return None
    return decode_reference


def reference_slice(reference, work, layer, sm_scale, cache_rows=None):
    """(rows, float64 out [n, (S_q,) H, 512]) on the first and last sequence: a cheap check that still sees both
    ends. cache_rows(rows) gives another cache's (kv, k_pe, kv_scale) of those sequences (an fp8 copy)."""
    rows = sorted({0, work.batch - 1})
    kv, k_pe, kv_scale = cache_rows(rows) if cache_rows else (layer.kv[rows], layer.k_pe[rows], None)
    seq_lens = torch.tensor([work.lens[b] for b in rows], dtype=torch.int32)
    out, _ = reference(
        layer.q[rows], layer.q_pe[rows], kv, k_pe, sm_scale=sm_scale, kv_scale=kv_scale, seq_lens=seq_lens,
        causal=work.causal,
    )  # fmt: skip
    return rows, out


def relative_error(out, rows, ref):
    got = out[rows].detach().to("cpu", torch.float64)
    if not torch.isfinite(got).all():
        return math.inf
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def measure_ceilings(device):
    """Copy bandwidth (GB/s, read + write) and bf16 matmul throughput (TFLOP/s) of this device, measured now."""
    ceilings = {"copy_gbps": copy_gbps(device), "matmul_tflops": matmul_tflops(device)}
    torch.cuda.empty_cache()
    return ceilings


def copy_gbps(device, size=2 << 30):
    src = torch.empty(size, dtype=torch.uint8, device=device).fill_(7)
    dst = torch.empty_like(src)
    us = common.median_us(lambda: dst.copy_(src), device, repeats=10, warmup_s=0.1)
    return 2 * size / us / 1e3


def matmul_tflops(device, size=8192):
    gen = torch.Generator(device=device).manual_seed(1)
    a, b = (torch.randn(size, size, generator=gen, device=device).to(torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    us = common.median_us(lambda: torch.mm(a, b, out=c), device, repeats=10, warmup_s=0.1)
    return 2 * size**3 / us / 1e6


def bench_config(work, device, methods, reference, repeats, seed, builders=BUILDERS):
    """Times every method on one workload; returns the result record (errors are recorded, not raised)."""
    num_layers = work.num_layers(device.type)
    generator = torch.Generator(device=device).manual_seed(seed)
    layers = make_layers(work, num_layers, device, generator)
    sm_scale = common.KEY_DIM**-0.5
    ref = reference_slice(reference, work, layers[0], sm_scale) if reference else None
    record = {
        "dtype": work.dtype_name, "batch": work.batch, "heads": work.heads, "seqlen": work.seqlen,
        "seqlen_q": work.seqlen_q, "ragged": work.ragged, "layers": num_layers, "bytes": work.bytes,
        "flops": work.flops, "methods": {},
    }  # fmt: skip
    for name in methods:
        entry = record["methods"][name] = {}
        try:
            run = builders[name](work, layers, sm_scale)
            us, out0 = time_method(run, num_layers, device, repeats)
        except Unavailable as why:
            entry["status"] = str(why)
            continue
        except Exception as error:  # a failing method must not hide the others' figures
            entry["status"] = f"failed: {type(error).__name__}: {error}".splitlines()[0][:300]
            continue
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        moved = work.bytes_with_keys_of(run.key_bytes) if hasattr(run, "key_bytes") else work.bytes
        entry.update(status="ok", us=us, gbps=moved / us / 1e3, tflops=work.flops / us / 1e6)
        if ref is not None:
            # an fp8 cache is checked against the reference of its dequantised values
            own = run.reference_slice(reference) if hasattr(run, "reference_slice") else ref
            entry["rel_err"] = relative_error(out0, *own)
            entry["check"] = "pass" if entry["rel_err"] <= TOLERANCE[work.dtype_name] else "FAIL"
        del out0, run  # the method's buffers (an fp8 copy of every layer) go before the next one is built
    record["speedup"] = speedups(record, "mla_ext")
    record["serving_speedup"] = speedups(record, SERVING)
    return record


def speedups(record, baseline):
    """peer time / baseline time for every other method that ran (above 1: the baseline is faster)."""
    mine = record["methods"].get(baseline, {})
    if mine.get("status") != "ok":
        return {}
    return {
        name: entry["us"] / mine["us"]
        for name, entry in record["methods"].items()
        if name not in ("mla_ext", baseline) and entry.get("status") == "ok"
    }


def flop_unit(device_type):
    """(label, factor from TFLOP/s): a CPU reads better in GFLOP/s."""
    return ("TFLOP/s", 1.0) if device_type == "cuda" else ("GFLOP/s", 1e3)


def progress_line(index, total, record, ceilings, device_type):
    unit, scale = flop_unit(device_type)
    work = f"{record['dtype']} B={record['batch']} H={record['heads']} S={record['seqlen']}"
    work += f" S_q={record['seqlen_q']} causal" * (record["seqlen_q"] > 1) + " ragged" * record["ragged"]
    work += f" L={record['layers']}"
    parts = []
    for name, entry in record["methods"].items():
        if entry.get("status") != "ok":
            parts.append(f"{name}: {entry['status']}")
            continue
        gbps, flops = common.format_rate(entry["gbps"]), common.format_rate(entry["tflops"] * scale)
        text = f"{name} {entry['us']:.1f} us {gbps} GB/s {flops} {unit}"
        if name == "mla_ext" and ceilings:
            text += f" ({100 * entry['gbps'] / ceilings['copy_gbps']:.0f}% copy)"
        if name in record["speedup"]:
            text += f" [mla_ext {record['speedup'][name]:.2f}x]"
        if "check" in entry:
            text += f" err {entry['rel_err']:.1e} {entry['check']}"
        parts.append(text)
    return f"[{index}/{total}] {work}: " + " | ".join(parts)


def markdown(meta, ceilings, records, peers, device_type):
    unit, scale = flop_unit(device_type)
    lines = [f"# mla_ext decode benchmark ({meta['device']})", ""]
    lines.append(f"{meta['date']}; torch {meta['torch']}; mla_ext {meta['mla_ext']}; timing: {meta['timing']}.")
    if "kv_len_per_split" in meta:
        lines.append(f"mla_ext ran with kv_len_per_split = {meta['kv_len_per_split']} (fixed, not its own choice).")
    if "queries" in meta:
        lines.append(f"Queries: {meta['queries']}; sequence lengths: {meta['lengths']}.")
    if "page_size" in meta:
        lines.append(f"mla_ext's paged calls used {meta['page_size']}-key pages of the same memory (peers: 64).")
    if "threads" in meta:
        lines.append(f"{meta['threads']} threads; load average {meta['load_average']:.1f} when the run started.")
    if ceilings:
        lines.append(
            f"Ceilings measured in this run: copy {ceilings['copy_gbps']:.0f} GB/s (read + write), "
            f"bf16 matmul {ceilings['matmul_tflops']:.0f} TFLOP/s."
        )
    missing = {
        name: entry["status"]
        for r in records
        for name, entry in r["methods"].items()
        if entry.get("status") != "ok" and name != "mla_ext"
    }
    shown = [p for p in peers if any(r["methods"].get(p, {}).get("status") == "ok" for r in records)]
    for name in peers:
        if name not in shown and name in missing:
            lines.append(f"{PEER_LABELS[name]}: {missing[name]}.")
    serving = [p for p in shown if p != SERVING] if SERVING in shown else []
    lines.append("Speedup = peer time / mla_ext time (above 1: mla_ext is faster). err = max|out - ref| / max|ref|.")
    if serving:
        lines.append(
            f"paged x <peer> = peer time / {PEER_LABELS[SERVING]} time: the serving call (64-token pages, block table, "
            "device seq_lens) against the peers given the same pages."
        )
    lines.append("")
    header = ["dtype", "B", "H", "S", "L", "mla_ext us", "GB/s", unit]
    if ceilings:
        header += ["% copy BW", "byte floor us"]
    for name in shown:
        header += [f"{PEER_LABELS[name]} us", f"x {PEER_LABELS[name]}"]
    header += [f"paged x {PEER_LABELS[name]}" for name in serving]
    header += ["err", "check"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in records:
        mine = r["methods"]["mla_ext"]
        row = [r["dtype"], r["batch"], r["heads"], r["seqlen"], r["layers"]]
        if mine.get("status") == "ok":
            row += [
                f"{mine['us']:.1f}",
                common.format_rate(mine["gbps"]),
                common.format_rate(mine["tflops"] * scale),
            ]
        else:
            row += [mine.get("status", "?"), "", ""]
        if ceilings:
            pct = f"{100 * mine['gbps'] / ceilings['copy_gbps']:.0f}%" if mine.get("status") == "ok" else ""
            row += [pct, f"{r['bytes'] / ceilings['copy_gbps'] / 1e3:.1f}"]
        for name in shown:
            entry = r["methods"].get(name, {})
            if entry.get("status") == "ok":
                ratio = r["speedup"].get(name)
                row += [f"{entry['us']:.1f}", f"{ratio:.2f}" if ratio else ""]
            else:
                row += [entry.get("status", ""), ""]
        row += [f"{r['serving_speedup'][name]:.2f}" if name in r["serving_speedup"] else "" for name in serving]
        row += [f"{mine['rel_err']:.1e}" if "rel_err" in mine else "", mine.get("check", "not checked")]
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    lines.append("")
    for mine_name, key, names in (("mla_ext", "speedup", shown), (SERVING, "serving_speedup", serving)):
        for name in names:
            for dtype_name in dict.fromkeys(r["dtype"] for r in records):
                ratios = [r[key][name] for r in records if name in r[key] and r["dtype"] == dtype_name]
                if not ratios:
                    continue
                geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
                lines.append(
                    f"{dtype_name}: {PEER_LABELS[mine_name]} vs {PEER_LABELS[name]}: {geomean:.2f}x geometric mean "
                    f"over {len(ratios)} configs ({min(ratios):.2f}x to {max(ratios):.2f}x)."
                )
    return "\n".join(lines) + "\n"


def plot(path, dtype_name, records, ceilings, device_type):
    """Achieved GB/s and FLOP/s of mla_ext vs S, one line per (B, H), ceilings as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit, flop_scale = flop_unit(device_type)
    fig, (ax_bw, ax_fl) = plt.subplots(1, 2, figsize=(14, 5.5))
    rows = [r for r in records if r["dtype"] == dtype_name and r["methods"]["mla_ext"].get("status") == "ok"]
    batches = sorted({r["batch"] for r in rows})
    colors = plt.get_cmap("viridis")(torch.linspace(0, 0.9, max(1, len(batches))).tolist())
    styles = ["-", "--", ":", "-."]
    for h_index, heads in enumerate(sorted({r["heads"] for r in rows})):
        for b_index, batch in enumerate(batches):
            line = sorted((r for r in rows if r["heads"] == heads and r["batch"] == batch), key=lambda r: r["seqlen"])
            if not line:
                continue
            seqlens = [r["seqlen"] for r in line]
            style = dict(color=colors[b_index], linestyle=styles[h_index % len(styles)], marker="o")
            label = f"B={batch} H={heads}"
            ax_bw.plot(seqlens, [r["methods"]["mla_ext"]["gbps"] for r in line], label=label, **style)
            flops = [r["methods"]["mla_ext"]["tflops"] * flop_scale for r in line]
            ax_fl.plot(seqlens, flops, label=label, **style)
    if ceilings:
        mm = ceilings["matmul_tflops"] * flop_scale
        for ax, value, text in ((ax_bw, ceilings["copy_gbps"], "device copy"), (ax_fl, mm, "bf16 matmul")):
            ax.axhline(value, color="red", linestyle=":")
            ax.annotate(f"{text} {value:.0f}", (0.01, value), xycoords=("axes fraction", "data"), color="red",
                        va="bottom")  # fmt: skip
    all_seqlens = sorted({r["seqlen"] for r in rows})
    for ax, label in ((ax_bw, "GB/s"), (ax_fl, unit)):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_seqlens, [str(s) for s in all_seqlens])
        ax.set_xlabel("sequence length S")
        ax.set_ylabel(f"achieved {label}")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.06)  # room for the ceiling labels
        ax.grid(True, alpha=0.3)
    ax_bw.set_title(f"mla_ext decode bandwidth ({dtype_name}, {device_type})")
    ax_fl.set_title(f"mla_ext decode throughput ({dtype_name}, {device_type})")
    fig.legend(*ax_bw.get_legend_handles_labels(), loc="center right", fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_metadata(device):
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:], "python": platform.python_version(), "torch": torch.__version__,
        "mla_ext": _version_of("mla_ext"), "build": mla_ext.build_info.as_dict(), "git": _git_commit(),
    }  # fmt: skip
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta.update(device=props.name, sm_count=props.multi_processor_count, cuda=torch.version.cuda)
        meta["timing"] = "CUDA graph over L layers, median of replays / L, after ~100 ms warm-up"
    else:
        # Other processes on the cores skew wall-clock figures: the load average says how busy the machine was.
        meta.update(device=_cpu_name(), threads=torch.get_num_threads(), load_average=os.getloadavg()[0])
        meta["timing"] = "wall clock over L layers, median of runs / L"
    for module in ("flash_mla", "flashinfer"):
        if importlib.util.find_spec(module) is not None:
            meta[module] = _version_of(module)
    return meta


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return f"CPU {platform.processor() or platform.machine()}"


def _git_commit():
    try:
        done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def _version_of(module):
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return getattr(importlib.import_module(module), "__version__", "unknown version")
    except Exception as error:  # an installed but broken peer is still worth naming
        return f"import fails: {type(error).__name__}"


def import_project():
    global mla_ext, common
    import mla_ext
    from benchmarks import common


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA is not available here; use --device cpu for the CPU kernel.")
    sys.path[:0] = [str(path.resolve()) for path in args.peer_path]  # prebuilt peers, found before installed ones
    import_project()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    reference = load_reference()
    if reference is None:
        print("correctness check skipped: tests/reference.py not found next to benchmarks/", flush=True)
    meta = run_metadata(device)
    print(f"mla_ext {meta['mla_ext']} on {meta['device']}, torch {meta['torch']}", flush=True)

    if args.ragged:
        from benchmarks.bench_ragged import run_ragged

        return run_ragged(args, device, time_method, reference, meta)

    ceilings = None
    if device.type == "cuda":
        ceilings = measure_ceilings(device)
        print(
            f"ceilings: copy {ceilings['copy_gbps']:.0f} GB/s, bf16 matmul {ceilings['matmul_tflops']:.0f} TFLOP/s",
            flush=True,
        )
    cpu_peers = (  # the others: CUDA only
        "eager", "mla_ext_paged", "mla_ext_paged_per_call", "mla_ext_seq_lens", "mla_ext_fp8", "mla_ext_fp8_block",
    )  # fmt: skip
    peers = [p for p in args.peers if device.type == "cuda" or p in cpu_peers]
    methods = ["mla_ext", *peers]
    work_list = [
        Workload(d, *config, seqlen_q=args.seqlen_q, ragged=args.ragged_lens)
        for d in args.dtypes
        for config in plan_configs(args, d)
    ]
    builders = dict(BUILDERS)
    if args.kv_len_per_split:
        builders["mla_ext"] = functools.partial(build_mla_ext, kv_len_per_split=args.kv_len_per_split)
        meta["kv_len_per_split"] = args.kv_len_per_split
    if args.seqlen_q > 1 or args.ragged_lens:
        meta["queries"] = f"S_q = {args.seqlen_q}" + (", causal" if args.seqlen_q > 1 else "")
        meta["lengths"] = "spread over [S/4, S]" if args.ragged_lens else "S"
    if args.page_size != FLASH_PAGE_SIZE:
        for name in ("mla_ext_paged", "mla_ext_paged_per_call"):
            builders[name] = functools.partial(builders[name], page_size=args.page_size)
        meta["page_size"] = args.page_size
    records = []
    for index, work in enumerate(work_list, 1):
        record = bench_config(work, device, methods, reference, args.repeats, seed=index, builders=builders)
        records.append(record)
        print(progress_line(index, len(work_list), record, ceilings, device.type), flush=True)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"bench_{device.type}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "ceilings": ceilings, "results": records}, indent=1))
    table = markdown(meta, ceilings, records, peers, device.type)
    stem.with_suffix(".md").write_text(table)
    print("\n" + table)
    written = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    if importlib.util.find_spec("matplotlib") is None:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)")
    else:
        for dtype_name in args.dtypes:
            path = args.out_dir / f"bench_{device.type}_{dtype_name}.png"
            plot(path, dtype_name, records, ceilings, device.type)
            written.append(path)
    print("wrote " + ", ".join(str(p) for p in written))

    mine = [r["methods"]["mla_ext"] for r in records]
    bad = [m for m in mine if m.get("status") != "ok" or m.get("check") == "FAIL"]
    if bad:
        print(f"{len(bad)} of {len(mine)} configs failed or mismatched the reference")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
