"""Builds decode problems: random queries, dense or paged caches in the layouts serving engines use, and NaN/inf
poison in every cache slot the kernel must not read (rows beyond seq_len, page tails, unused pages)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from mla_ext import HEAD_DIM, ROPE_DIM


@dataclass
class Problem:
    q: torch.Tensor  # [B, H, D] or [B, S_q, H, D]
    q_pe: torch.Tensor  # [B, H, Dpe] or [B, S_q, H, Dpe]
    kv: torch.Tensor  # dense [B, S_kv, D] or paged [P, page_size, D]
    k_pe: torch.Tensor  # dense [B, S_kv, Dpe] or paged [P, page_size, Dpe]
    block_table: torch.Tensor | None  # int32 [B, max_pages]
    seq_lens: torch.Tensor | None  # int32 [B]
    causal: bool = False
    kv_scale: torch.Tensor | None = None  # float32, for a float8_e4m3fn cache (to_fp8_cache)

    def args(self):
        return (self.q, self.q_pe, self.kv, self.k_pe)

    def kwargs(self, **extra):
        """Keyword arguments shared by the ops and the Python wrapper (plus `extra`)."""
        kwargs = dict(block_table=self.block_table, seq_lens=self.seq_lens, causal=self.causal)
        if self.kv_scale is not None:
            kwargs["kv_scale"] = self.kv_scale
        kwargs.update(extra)
        return kwargs

    def reference_kwargs(self, sm_scale=None):
        return dict(
            block_table=self.block_table, seq_lens=self.seq_lens, causal=self.causal, sm_scale=sm_scale,
            kv_scale=self.kv_scale,
        )  # fmt: skip


def randn(gen, shape, dtype, device, scale=1.0):
    """Fresh normal values drawn on the CPU from `gen` (reproducible on any device)."""
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(dtype).to(device)


def _poison(cache_d, cache_pe, index):
    """NaN in the latent part and inf in the rope part: a 0 * NaN or an inf - inf anywhere shows up in the output."""
    cache_d[index] = math.nan
    cache_pe[index] = math.inf


def make_queries(gen, batch, seqlen_q, num_heads, dtype, device, layout="contiguous", scale=2.0):
    """q [B, (S_q,) H, D] and q_pe in one of three layouts; S_q == 1 gives the 3-d [B, H, *] form.

    contiguous: two contiguous tensors.
    transposed: vLLM's q.transpose(0, 1) of a head-major [(S_q,) H, B, *] buffer (batch stride is not the largest).
    fused:      two views [..., :D] and [..., D:] of one [B, (S_q,) H, D + Dpe] tensor.
    """
    shape = (batch, num_heads) if seqlen_q == 1 else (batch, seqlen_q, num_heads)
    if layout == "contiguous":
        return (
            randn(gen, (*shape, HEAD_DIM), dtype, device, scale),
            randn(gen, (*shape, ROPE_DIM), dtype, device, scale),
        )
    if layout == "fused":
        full = randn(gen, (*shape, HEAD_DIM + ROPE_DIM), dtype, device, scale)
        return full[..., :HEAD_DIM], full[..., HEAD_DIM:]
    if layout == "transposed":
        return (
            head_major_view(randn(gen, (*shape[1:], batch, HEAD_DIM), dtype, device, scale)),
            head_major_view(randn(gen, (*shape[1:], batch, ROPE_DIM), dtype, device, scale)),
        )
    raise ValueError(f"unknown query layout {layout!r}")


def head_major_view(buffer):
    """[(S_q,) H, B, *] buffer -> [B, (S_q,) H, *] view (the batch dim moved to the front, not copied)."""
    order = list(range(buffer.dim()))
    batch_dim = buffer.dim() - 2
    return buffer.permute(batch_dim, *order[:batch_dim], buffer.dim() - 1)


def empty_outputs_like(q, poison=math.nan):
    """out [like q, last dim D] with q's stride order, and a contiguous fp32 lse [q.shape[:-1]], filled with poison."""
    if q.stride(0) < q.stride(1):  # q is a head-major view: give out the same layout
        out_shape = (*q.shape[1:-1], q.shape[0], HEAD_DIM)
        out = head_major_view(torch.full(out_shape, poison, dtype=q.dtype, device=q.device))
    else:
        out = torch.full((*q.shape[:-1], HEAD_DIM), poison, dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:-1], poison, dtype=torch.float32, device=q.device)
    return out, lse


def _cache_pair(gen, rows_shape, dtype, device, cache_layout):
    """(kv, k_pe) with leading shape rows_shape: two contiguous tensors or two views of one [..., D + Dpe] tensor."""
    if cache_layout == "fused":
        full = randn(gen, (*rows_shape, HEAD_DIM + ROPE_DIM), dtype, device)
        return full[..., :HEAD_DIM], full[..., HEAD_DIM:]
    if cache_layout == "separate":
        return randn(gen, (*rows_shape, HEAD_DIM), dtype, device), randn(gen, (*rows_shape, ROPE_DIM), dtype, device)
    raise ValueError(f"unknown cache layout {cache_layout!r}")


def make_dense_cache(gen, lens, capacity, dtype, device, cache_layout="separate"):
    """Dense kv [B, capacity, D] / k_pe [B, capacity, Dpe]; every row at or beyond lens[b] is poisoned."""
    kv, k_pe = _cache_pair(gen, (len(lens), capacity), dtype, device, cache_layout)
    for b, length in enumerate(lens):
        _poison(kv, k_pe, (b, slice(max(length, 0), None)))
    return kv, k_pe


def make_paged_cache(gen, lens, page_size, dtype, device, cache_layout="separate", spare_slots=1, spare_pages=2):
    """Paged kv [P, page_size, D] / k_pe and an int32 block_table [B, max_pages] with shuffled page ids.

    Unused page tails and spare pages are poisoned. Block-table slots past a sequence's used pages point at a
    poisoned spare page or hold out-of-range ids (-1, P + 3): the kernel must never read them.
    """
    rng = random.Random(int(torch.randint(0, 2**31, (1,), generator=gen)))
    used = [math.ceil(max(length, 0) / page_size) for length in lens]
    max_pages = max(used + [1]) + spare_slots
    num_pages = sum(used) + spare_pages
    page_ids = list(range(num_pages))
    rng.shuffle(page_ids)
    kv, k_pe = _cache_pair(gen, (num_pages, page_size), dtype, device, cache_layout)
    spare = page_ids[sum(used) :]
    for page in spare:
        _poison(kv, k_pe, page)
    table = []
    for length, count in zip(lens, used, strict=True):
        pages = [page_ids.pop(0) for _ in range(count)]
        if count and length % page_size:
            _poison(kv, k_pe, (pages[-1], slice(length % page_size, None)))
        filler = [spare[0] if spare else -1, -1, num_pages + 3]
        table.append(pages + [filler[i % 3] for i in range(max_pages - count)])
    block_table = torch.tensor(table, dtype=torch.int32, device=device).reshape(len(lens), max_pages)
    return kv, k_pe, block_table


def varlen_lens(gen, batch, max_len):
    """[max_len, 0, 1, random...] shuffled: a full, an empty and a one-key sequence, then random lengths."""
    rng = random.Random(int(torch.randint(0, 2**31, (1,), generator=gen)))
    lens = [max_len, 0, 1] + [rng.randint(1, max_len) for _ in range(max(batch - 3, 0))]
    lens = lens[:batch]
    rng.shuffle(lens)
    return lens


def make_problem(
    gen,
    *,
    device,
    dtype,
    lens,
    num_heads,
    seqlen_q=1,
    causal=False,
    page_size=None,
    cache_layout="separate",
    q_layout="contiguous",
    dense_seq_lens=None,
    dense_slack=0,
    spare_slots=1,
):
    """A complete decode problem. page_size None means a dense cache.

    Dense: capacity = max(lens) + dense_slack; seq_lens is passed when dense_seq_lens (default: when some sequence
    is shorter than the capacity). Paged: seq_lens is always passed; each block-table row has spare_slots slots
    beyond the longest sequence's pages.
    """
    batch = len(lens)
    q, q_pe = make_queries(gen, batch, seqlen_q, num_heads, dtype, device, q_layout)
    if page_size is None:
        capacity = max(lens + [0]) + dense_slack
        if dense_seq_lens is None:
            dense_seq_lens = any(length != capacity for length in lens)
        kv, k_pe = make_dense_cache(gen, lens, capacity, dtype, device, cache_layout)
        block_table = None
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=device) if dense_seq_lens else None
    else:
        kv, k_pe, block_table = make_paged_cache(gen, lens, page_size, dtype, device, cache_layout, spare_slots)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return Problem(q, q_pe, kv, k_pe, block_table, seq_lens, causal)


FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_BLOCK = 128  # kv values under one per-block scale


def to_fp8_cache(gen, problem, per_block):
    """The problem's cache stored in fp8 as engines store it, its NaN/inf poison kept (as fp8 NaN), and kv_scale set.

    Per tensor (vLLM's fp8 cache): one [..., 576] byte buffer viewed as fp8 kv [..., :512] and k_pe [..., 512:], one
    scale for both. Per block (FlashMLA's 656-byte token): one [..., 656] byte buffer viewed as fp8 kv [..., :512],
    four float32 scales [..., 512:528] (one per 128 kv values) and k_pe in q's dtype [..., 528:], unscaled.
    The scales are amax / 448 times a random factor in [1, 2): the fp8 values use the top of their range.
    """
    kv, k_pe = problem.kv.float(), problem.k_pe.float()
    finite = torch.isfinite(kv).all(-1, keepdim=True) & torch.isfinite(k_pe).all(-1, keepdim=True)
    rows = kv.shape[:-1]
    jitter = 1.0 + torch.rand((), generator=gen).item()  # >= 1: no value passes 448 (fp8 has no inf)
    if per_block:
        buffer = torch.empty((*rows, HEAD_DIM + 4 * 4 + ROPE_DIM * 2), dtype=torch.uint8, device=kv.device)
        blocks = kv.reshape(*rows, HEAD_DIM // FP8_BLOCK, FP8_BLOCK)
        amax = blocks.abs().nan_to_num(0.0, 0.0, 0.0).amax(-1).clamp_min(1e-3)
        scale = (amax / FP8_MAX * jitter).masked_fill(~finite, math.nan)  # [*rows, 4]
        buffer[..., HEAD_DIM:528].view(torch.float32).copy_(scale)
        buffer[..., :HEAD_DIM].view(FP8).copy_((blocks / scale[..., None]).reshape(kv.shape).to(FP8))
        buffer[..., 528:].view(problem.q.dtype).copy_(problem.k_pe)
        problem.kv_scale = buffer[..., HEAD_DIM:528].view(torch.float32)
        problem.kv, problem.k_pe = buffer[..., :HEAD_DIM].view(FP8), buffer[..., 528:].view(problem.q.dtype)
    else:
        buffer = torch.empty((*rows, HEAD_DIM + ROPE_DIM), dtype=torch.uint8, device=kv.device)
        amax = max(kv.nan_to_num(0.0, 0.0, 0.0).abs().max().item(), k_pe.nan_to_num(0.0, 0.0, 0.0).abs().max().item())
        scale = max(amax, 1e-3) / FP8_MAX * jitter
        buffer[..., :HEAD_DIM].view(FP8).copy_((kv / scale).to(FP8))
        buffer[..., HEAD_DIM:].view(FP8).copy_((k_pe / scale).to(FP8))
        problem.kv_scale = torch.tensor([scale], dtype=torch.float32, device=kv.device)
        problem.kv, problem.k_pe = buffer[..., :HEAD_DIM].view(FP8), buffer[..., HEAD_DIM:].view(FP8)
    return problem


def random_states(gen, shape, dtype, device):
    """(out [*shape, HEAD_DIM], lse [*shape]) with about a quarter of the rows empty (out 0, lse -inf)."""
    out = randn(gen, (*shape, HEAD_DIM), dtype, device)
    lse = randn(gen, shape, torch.float32, device, scale=3.0)
    empty = torch.rand(shape, generator=gen) < 0.25
    lse[empty.to(device)] = -math.inf
    out[empty.to(device)] = 0
    return out, lse
