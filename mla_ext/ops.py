"""Typed Python wrappers over torch.ops.mla.*, their fake (meta) kernels, and the inference-only autograd error."""


import torch
from torch import Tensor

__all__ = ["HEAD_DIM", "ROPE_DIM", "decode", "plan", "merge_states", "set_strict", "is_strict"]

# The only head dims the kernels support (DeepSeek-V2/V3's latent and rope widths); the C++ checks enforce them.
HEAD_DIM = 512  # D: latent width of q and kv, also the output width
ROPE_DIM = 64  # Dpe: rotary width of q_pe and k_pe


def decode(
    q: Tensor,
    q_pe: Tensor,
    kv: Tensor,
    k_pe: Tensor,
    *,
    sm_scale: float | None = None,
    kv_len_per_split: int | None = None,
    block_table: Tensor | None = None,
    seq_lens: Tensor | None = None,
    causal: bool = False,
    kv_scale: Tensor | None = None,
    return_lse: bool = False,
    out: Tensor | None = None,
    lse: Tensor | None = None,
    plan: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Absorbed MLA decode attention with split-KV (the attention step of DeepSeek-V2/V3/R1 and Kimi-K2).

    For each sequence b, query token t and head h, over the visible keys j::

        score[j] = sm_scale * (q[b,t,h] . kv[b,j] + q_pe[b,t,h] . k_pe[b,j])
        out[b,t,h] = sum_j softmax(score)[j] * kv[b,j]        (V is the latent cache itself)
        lse[b,t,h] = log(sum_j exp(score[j]))                  (natural log, float32)

    Args:
        q: ``[B, H, D]`` or ``[B, S_q, H, D]`` query in the latent space (D = 512).
        q_pe: ``[B, H, Dpe]`` or ``[B, S_q, H, Dpe]`` rotary part of the query (Dpe = 64).
        kv: the latent cache. Dense: ``[B, S_kv, D]``. Paged: ``[P, page_size, D]`` with ``block_table``.
        k_pe: the rotary key cache, ``[B, S_kv, Dpe]`` or ``[P, page_size, Dpe]``. ``kv`` and ``k_pe`` may be the
            two views ``cache[..., :512]`` and ``cache[..., 512:]`` of one ``[..., 576]`` cache.
        sm_scale: softmax scale; default ``1 / sqrt(D + Dpe)`` (576 ** -0.5).
        kv_len_per_split: keys per split-KV chunk, a positive multiple of 16. ``None`` picks it from the shapes
            and the device (SM count on CUDA, threads on CPU). Any split gives the same result up to fp32 rounding;
            a fixed value makes results batch-invariant.
        block_table: int32 ``[B, max_pages]``; page ``i`` of sequence ``b`` is ``kv[block_table[b, i]]``.
            Requires ``seq_lens``.
        seq_lens: int32 ``[B]``, keys held by each sequence (dense default: all ``S_kv``). Values are read on the
            device: out-of-range values are clamped to ``[0, capacity]`` (or raise in strict mode).
        causal: with ``S_q > 1``, token ``t`` sees keys ``j < seq_len - S_q + 1 + t`` (bottom-right aligned, as in
            speculative decoding). No effect when ``S_q == 1``.
        kv_scale: float32 scales of a ``float8_e4m3fn`` cache (fp16/bf16 queries), whose values are
            ``fp8 value * scale``. Per tensor: shape ``[]`` or ``[1]``, one scale for ``kv`` and ``k_pe`` (both fp8;
            vLLM's fp8 cache with its ``k_scale``). Per block: ``[B, S_kv, 4]`` or ``[P, page_size, 4]``, one scale per
            128 values of each ``kv`` row, with ``k_pe`` unscaled in q's dtype (FlashMLA's 656-byte ``fp8_ds_mla``
            token, viewed as three tensors). CPU tensors only in this version.
        return_lse: also return ``lse`` (float32, shape of ``q`` without its last dim).
        out: optional preallocated output (shape and dtype of ``q``, last dim contiguous); written in place.
        lse: optional preallocated float32 lse; written in place.
        plan: the schedule :func:`plan` made from this call's arguments (or another layer's with the same shapes and
            the same ``seq_lens``); the call then skips planning it again. ``None`` plans per call.

    Returns:
        ``out`` (dtype of ``q``), or ``(out, lse)`` when ``return_lse`` is true. A query that sees no key gets
        ``out = 0`` and ``lse = -inf``.

    Raises:
        RuntimeError: on a wrong rank, shape, dtype, device, stride or alignment (the message names the argument),
            unsupported head dims (only D=512, Dpe=64), ``block_table`` without ``seq_lens``, or a
            ``kv_len_per_split`` that is not a positive multiple of 16.
        ValueError: in strict mode (``set_strict(True)`` or ``MLA_EXT_STRICT=1``), for negative or over-capacity
            ``seq_lens`` or ``block_table`` entries outside ``[0, P)``.

    All four inputs share one dtype: float16, bfloat16 or float32 (or an fp8 cache with ``kv_scale``); accumulation
    is float32. The op is
    inference-only (no backward), does not synchronise with the host, and is CUDA-graph capturable.
    """
    args = (q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens, causal, kv_scale, plan)
    if out is None and lse is None:
        if return_lse:
            return torch.ops.mla.decode_with_lse(*args)
        return torch.ops.mla.decode(*args)
    if out is None:
        out = q.new_empty(q.shape)
    if lse is None and return_lse:
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    torch.ops.mla.decode_out(*args, out=out, lse=lse)
    return (out, lse) if return_lse else out


def plan(
    q: Tensor,
    q_pe: Tensor,
    kv: Tensor,
    k_pe: Tensor,
    *,
    sm_scale: float | None = None,
    kv_len_per_split: int | None = None,
    block_table: Tensor | None = None,
    seq_lens: Tensor | None = None,
    causal: bool = False,
    kv_scale: Tensor | None = None,
) -> Tensor:
    """Plans a decode step once for all its layers, as engines do (FlashMLA's get_mla_metadata, FlashInfer's plan).

    Takes :func:`decode`'s arguments and returns an int32 tensor on their device to pass as ``decode(..., plan=)`` to
    every call of the step whose arguments have the same shapes, dtype, split and ``seq_lens`` contents (typically
    all layers: each passes its own cache and queries). On CUDA it lays out, from the device's ``seq_lens``, the work
    that each call would otherwise plan with a kernel of its own; no host synchronisation, CUDA-graph capturable.
    Make it after ``seq_lens`` hold the step's lengths: a call reads ``seq_lens`` again, and a plan from other
    lengths gives wrong results. A plan made for other shapes raises.
    The tensor may be empty where the call needs nothing planned ahead (CPU, up to 32 query rows per sequence, one
    sequence, a fixed ``kv_len_per_split``, an fp8 cache outside Hopper's sm_90a kernel).
    """
    return torch.ops.mla.plan(q, q_pe, kv, k_pe, sm_scale, kv_len_per_split, block_table, seq_lens, causal, kv_scale)


def merge_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Combines two partial attentions over disjoint key sets (prefix/suffix caches, context-parallel shards).

    ``out_*``: ``[..., D]`` of one dtype (float16, bfloat16 or float32); ``lse_*``: float32 ``[...]``, natural log.
    Returns ``(out, lse)`` with ``out = (exp(lse_a - m) * out_a + exp(lse_b - m) * out_b) / (exp(lse_a - m) +
    exp(lse_b - m))``, ``m = max(lse_a, lse_b)``, and ``lse = m + log(exp(lse_a - m) + exp(lse_b - m))``. Where both
    lse are -inf the result is ``out = 0``, ``lse = -inf``.
    """
    return torch.ops.mla.merge_states(out_a, lse_a, out_b, lse_b)


def set_strict(enabled: bool) -> None:
    """Strict mode copies ``seq_lens`` and ``block_table`` to the host on every call and raises ValueError on the
    first bad entry. Off by default (also enabled by the environment variable ``MLA_EXT_STRICT=1``); it cannot be
    used while capturing a CUDA graph."""
    torch.ops.mla.set_strict(bool(enabled))


def is_strict() -> bool:
    """Whether strict mode is on."""
    return torch.ops.mla.is_strict()


# Fake kernels: output shapes and dtypes from the inputs alone, for torch.compile and meta tensors.


def _decode_fake_outputs(q: Tensor) -> tuple[Tensor, Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("mla::decode")
def _decode_fake(q, q_pe, kv, k_pe, sm_scale=None, kv_len_per_split=None, block_table=None, seq_lens=None,
                 causal=False, kv_scale=None, plan=None):
    return _decode_fake_outputs(q)[0]


@torch.library.register_fake("mla::decode_with_lse")
def _decode_with_lse_fake(q, q_pe, kv, k_pe, sm_scale=None, kv_len_per_split=None, block_table=None,
                          seq_lens=None, causal=False, kv_scale=None, plan=None):
    return _decode_fake_outputs(q)


@torch.library.register_fake("mla::decode_out")
def _decode_out_fake(q, q_pe, kv, k_pe, sm_scale=None, kv_len_per_split=None, block_table=None, seq_lens=None,
                     causal=False, kv_scale=None, plan=None, *, out, lse=None):
    return None


@torch.library.register_fake("mla::plan")
def _plan_fake(q, q_pe, kv, k_pe, sm_scale=None, kv_len_per_split=None, block_table=None, seq_lens=None,
               causal=False, kv_scale=None):
    # Its length follows the device's schedule (SM count, kernel choice), not the shapes alone.
    length = torch.library.get_ctx().new_dynamic_size()
    return q.new_empty((length,), dtype=torch.int32)


@torch.library.register_fake("mla::merge_states")
def _merge_states_fake(out_a, lse_a, out_b, lse_b):
    return out_a.new_empty(out_a.shape), lse_a.new_empty(lse_a.shape)


# Inference-only: a backward through these ops is an error, said plainly rather than a missing grad_fn.


def _no_backward(op_name: str):
    def backward(ctx, *grads):
        raise RuntimeError(f"mla.{op_name} is an inference kernel and has no backward; compute the attention with "
                           "differentiable PyTorch ops if you need gradients")

    return backward


def _setup_context(ctx, inputs, output):
    pass


for _name in ("decode", "decode_with_lse", "merge_states"):
    torch.library.register_autograd(f"mla::{_name}", _no_backward(_name), setup_context=_setup_context)
