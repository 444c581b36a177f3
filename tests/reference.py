"""The float64 reference every test compares against.

It reads the inputs exactly as stored (any dtype, any strides), so input rounding is shared with the kernel and
only the kernel's arithmetic is measured. Invisible keys are selected away, never multiplied by a zero weight, so
NaN/inf poison in unused cache slots cannot leak into the reference either.

Visibility rules (the operator contract):
- seq_lens are clamped to [0, capacity]; capacity = S_kv (dense) or max_pages * page_size (paged).
- a page whose block_table entry is outside [0, P) holds no visible key.
- causal with S_q query tokens: token t sees keys j < seq_len - S_q + 1 + t (bottom-right aligned).
- a row that sees no key: out 0, lse -inf.
- a float8_e4m3fn cache holds fp8 value x kv_scale: one scale for kv and k_pe, or one per 128 values of each kv row
  (k_pe then unscaled).
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64


def _gather_keys(kv, k_pe, block_table):
    """Per-sequence keys [B, capacity, D] / [B, capacity, Dpe] in float64 and a [B, capacity] mask of real pages."""
    if block_table is None:  # dense: one page per sequence
        page_ok = torch.ones(kv.shape[:2], dtype=torch.bool)
        return kv.detach().to("cpu", F64), k_pe.detach().to("cpu", F64), page_ok
    block_table = block_table.detach().to(kv.device, torch.int64)
    num_pages, page_size = kv.shape[0], kv.shape[1]
    batch, max_pages = block_table.shape
    in_range = (block_table >= 0) & (block_table < num_pages)  # [B, max_pages]
    safe = torch.where(in_range, block_table, torch.zeros_like(block_table))
    if num_pages == 0:  # nothing to gather; every page is invisible
        keys = torch.zeros(batch, max_pages * page_size, kv.shape[2], dtype=F64)
        keys_pe = torch.zeros(batch, max_pages * page_size, k_pe.shape[2], dtype=F64)
    else:  # gather the pages first, then widen: the cache itself may be many GB
        keys = kv.detach()[safe].to("cpu", F64).reshape(batch, max_pages * page_size, kv.shape[2])
        keys_pe = k_pe.detach()[safe].to("cpu", F64).reshape(batch, max_pages * page_size, k_pe.shape[2])
    page_ok = in_range.repeat_interleave(page_size, dim=1).cpu()  # [B, capacity]
    return keys, keys_pe, page_ok


def dequantize(kv, k_pe, kv_scale):
    """float64 values of an fp8 cache: per tensor (kv_scale of one element) or per 128 values of each kv row."""
    scale = kv_scale.detach().to("cpu", F64)
    kv64, k_pe64 = kv.detach().to("cpu", F64), k_pe.detach().to("cpu", F64)
    if scale.numel() == 1:
        return kv64 * scale.reshape(()), k_pe64 * scale.reshape(())
    blocks = kv64.reshape(*kv64.shape[:-1], scale.shape[-1], -1) * scale[..., None]
    return blocks.reshape(kv64.shape), k_pe64


def visible_mask(seq_lens, batch, seqlen_q, capacity, causal):
    """[B, S_q, capacity] bool: which keys each query token of each sequence sees (page validity not included)."""
    if seq_lens is None:
        lens = torch.full((batch,), capacity, dtype=torch.int64)
    else:
        lens = seq_lens.detach().to("cpu", torch.int64).clamp(0, capacity)
    t = torch.arange(seqlen_q)
    limit = lens[:, None] - seqlen_q + 1 + t[None, :] if causal else lens[:, None].expand(batch, seqlen_q)
    j = torch.arange(capacity)
    return j[None, None, :] < limit[:, :, None]


def decode_reference(
    q, q_pe, kv, k_pe, *, sm_scale=None, block_table=None, seq_lens=None, causal=False, kv_scale=None
):
    """float64 (out, lse) on the CPU, shaped like q ([B, H, D] or [B, S_q, H, D]) and q[..., 0]."""
    if kv_scale is not None:
        kv, k_pe = dequantize(kv, k_pe, kv_scale)
    squeeze = q.dim() == 3
    q64 = q.detach().to("cpu", F64)
    q_pe64 = q_pe.detach().to("cpu", F64)
    if squeeze:
        q64, q_pe64 = q64.unsqueeze(1), q_pe64.unsqueeze(1)
    batch, seqlen_q, num_heads, head_dim = q64.shape
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim + q_pe64.shape[-1])

    keys, keys_pe, page_ok = _gather_keys(kv, k_pe, block_table)  # [B, C, D], [B, C, Dpe], [B, C]
    capacity = keys.shape[1]
    visible = visible_mask(seq_lens, batch, seqlen_q, capacity, causal) & page_ok[:, None, :]  # [B, S_q, C]
    # Select, do not multiply: slots no token sees become exact zeros before any arithmetic touches them.
    seen = visible.any(dim=1)[..., None]  # [B, C, 1]
    keys = torch.where(seen, keys, torch.zeros_like(keys))
    keys_pe = torch.where(seen, keys_pe, torch.zeros_like(keys_pe))

    scores = sm_scale * (
        torch.einsum("bthd,bjd->bthj", q64, keys) + torch.einsum("bthe,bje->bthj", q_pe64, keys_pe)
    )  # [B, S_q, H, C]
    mask = visible[:, :, None, :].expand_as(scores)
    scores = scores.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)  # -inf for a row with no visible key
    shift = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    probs = torch.exp(scores - shift[..., None])  # exactly 0 where masked
    out = torch.einsum("bthj,bjd->bthd", probs, keys)
    if squeeze:
        out, lse = out.squeeze(1), lse.squeeze(1)
    return out, lse


def merge_reference(out_a, lse_a, out_b, lse_b):
    """float64 merge of two partial attentions over disjoint key sets; both -inf gives out 0, lse -inf."""
    out_a, out_b = out_a.detach().to("cpu", F64), out_b.detach().to("cpu", F64)
    lse_a, lse_b = lse_a.detach().to("cpu", F64), lse_b.detach().to("cpu", F64)
    m = torch.maximum(lse_a, lse_b)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w_a = torch.exp(lse_a - m_safe)  # 0 for an -inf side
    w_b = torch.exp(lse_b - m_safe)
    total = w_a + w_b
    norm = torch.where(total > 0, total, torch.ones_like(total))
    # Select the sides, so an unwritten/NaN partial with zero weight cannot leak in.
    part_a = torch.where(w_a[..., None] > 0, out_a * w_a[..., None], torch.zeros_like(out_a))
    part_b = torch.where(w_b[..., None] > 0, out_b * w_b[..., None], torch.zeros_like(out_b))
    out = (part_a + part_b) / norm[..., None]
    lse = torch.where(total > 0, m_safe + torch.log(norm), torch.full_like(m, -math.inf))
    return out, lse
