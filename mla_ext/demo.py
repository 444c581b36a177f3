"""Decode a few tokens through a small DeepSeek-shaped MLA attention layer, with mla_ext over a paged KV cache.

    python3 -m mla_ext.demo [--device cuda|cpu] [--steps 8] [--dtype bf16|fp16|fp32]

The layer has random weights (nothing is downloaded): hidden size 1024, 16 heads, a 512-wide compressed KV latent
and a 64-wide rotary key shared by all heads, as in DeepSeek-V2/V3. Four sequences of different lengths live in a
pool of 64-token pages, handed out in shuffled order and tracked by a block table. Every step appends each
sequence's new token (its latent and rotary key) to the cache, then runs attention with mla_ext.decode in the
"absorbed" form: the per-head key up-projection is folded into the query and the value up-projection is applied
to the output, so the kernel attends straight over the 576 values cached per token.

Each step is checked against the same layer written the textbook way in float64: per-head keys and values
up-projected from the cached latents, then plain softmax attention. Pool slots that hold no token are filled with
NaN, so a kernel that read past a sequence's end would fail the check.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import torch

import mla_ext
from mla_ext.bench_utils import decode_bytes, format_rate, median_us

HIDDEN = 1024
HEADS = 16
KV_LORA_RANK = 512  # the latent width D the kernel sees
ROPE_DIM = 64  # Dpe
NOPE_DIM = 128  # per-head query/key width without rotary part
V_DIM = 128  # per-head value width
ROPE_BASE = 10000.0
PAGE_SIZE = 64
PROMPT_LENS = (63, 250, 1024, 1777)  # 63 and 1024 make a step open a fresh page
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOLERANCE = {"bf16": 3e-2, "fp16": 5e-3, "fp32": 2e-3}  # on max|y - y_ref| / max|y_ref| of the layer output


@dataclass
class LayerWeights:
    w_q: torch.Tensor  # [H * (NOPE + ROPE), HIDDEN]
    w_kv_down: torch.Tensor  # [KV_LORA_RANK + ROPE, HIDDEN]: token -> (latent, rotary key)
    kv_norm: torch.Tensor  # [KV_LORA_RANK]: RMSNorm gain on the latent
    w_k_up: torch.Tensor  # [H, NOPE, KV_LORA_RANK]: latent -> per-head key
    w_v_up: torch.Tensor  # [H, V_DIM, KV_LORA_RANK]: latent -> per-head value
    w_o: torch.Tensor  # [HIDDEN, H * V_DIM]

    @staticmethod
    def random(generator):
        def weight(*shape):  # scaled so activations stay O(1)
            return torch.randn(*shape, generator=generator, dtype=torch.float64) / math.sqrt(shape[-1])

        return LayerWeights(
            w_q=weight(HEADS * (NOPE_DIM + ROPE_DIM), HIDDEN),
            w_kv_down=weight(KV_LORA_RANK + ROPE_DIM, HIDDEN),
            kv_norm=1 + 0.1 * torch.randn(KV_LORA_RANK, generator=generator, dtype=torch.float64),
            w_k_up=weight(HEADS, NOPE_DIM, KV_LORA_RANK),
            w_v_up=weight(HEADS, V_DIM, KV_LORA_RANK),
            w_o=weight(HIDDEN, HEADS * V_DIM),
        )

    def to(self, device, dtype):
        return LayerWeights(**{name: t.to(device, dtype) for name, t in vars(self).items()})


def rope(x, positions):
    """Rotary embedding of x [..., 64] at integer positions shaped like x[..., 0] (rotate-half convention)."""
    half = ROPE_DIM // 2
    freqs = ROPE_BASE ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    angles = positions.to(torch.float64)[..., None] * freqs
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def project_query(w, x, positions):
    """x [B, HIDDEN] at positions [B] -> q_nope [B, H, NOPE], q_pe [B, H, ROPE]."""
    q = (x @ w.w_q.T).view(-1, HEADS, NOPE_DIM + ROPE_DIM)
    return q[..., :NOPE_DIM], rope(q[..., NOPE_DIM:], positions[:, None].expand(-1, HEADS))


def project_latent(w, x, positions):
    """x [N, HIDDEN] at positions [N] -> what the cache stores per token: latent [N, 512], rotary key [N, 64]."""
    down = x @ w.w_kv_down.T
    latent = down[:, :KV_LORA_RANK]
    latent = latent * torch.rsqrt(latent.pow(2).mean(-1, keepdim=True) + 1e-6) * w.kv_norm
    return latent, rope(down[:, KV_LORA_RANK:], positions)


class PagedCache:
    """The latents of all sequences in one pool of fixed-size pages (the serving layout).

    Page i of sequence b is pool[block_table[b, i]]. Pages are handed out in shuffled order, so a sequence's
    pages are scattered over the pool, as they are after a server has run for a while.
    """

    def __init__(self, num_pages, batch, max_pages, dtype, device, generator):
        # Slots that hold no token are NaN: they are never visible, and must never reach the output.
        self.pool = torch.full((num_pages, PAGE_SIZE, KV_LORA_RANK + ROPE_DIM), math.nan, dtype=dtype, device=device)
        self.block_table = torch.zeros(batch, max_pages, dtype=torch.int32, device=device)  # [B, max_pages]
        self.seq_lens = torch.zeros(batch, dtype=torch.int32, device=device)  # [B]
        self.free_pages = torch.randperm(num_pages, generator=generator).tolist()
        self.pages = [[] for _ in range(batch)]  # host copy of each sequence's page list
        self.lens = [0] * batch  # host copy of seq_lens

    @property
    def kv(self):
        return self.pool[..., :KV_LORA_RANK]  # [P, PAGE_SIZE, 512], a view: no copy

    @property
    def k_pe(self):
        return self.pool[..., KV_LORA_RANK:]  # [P, PAGE_SIZE, 64]

    def append(self, seq, latent, k_pe):
        """Writes tokens latent [N, 512] / k_pe [N, 64] after the end of sequence `seq`, opening pages as needed."""
        start = self.lens[seq]
        slots = []
        for pos in range(start, start + latent.shape[0]):
            if pos % PAGE_SIZE == 0:
                self.pages[seq].append(self.free_pages.pop())
            slots.append(self.pages[seq][pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE)
        rows = torch.cat([latent, k_pe], dim=-1).to(self.pool.device, self.pool.dtype)
        self.pool.view(-1, KV_LORA_RANK + ROPE_DIM)[torch.tensor(slots, device=self.pool.device)] = rows
        self.lens[seq] = start + latent.shape[0]
        pages = self.pages[seq]
        self.block_table[seq, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self.seq_lens[seq] = self.lens[seq]


def attention_absorbed(w, cache, x, positions, dtype):
    """The fast path: (layer output [B, HIDDEN] in fp32, a no-argument call of the decode kernel for timing)."""
    q_nope, q_pe = project_query(w, x, positions)
    q_latent = torch.einsum("bhn,hnc->bhc", q_nope, w.w_k_up)  # absorb the key up-projection into the query
    q_latent, q_pe = q_latent.to(dtype), q_pe.to(dtype)  # [B, H, 512], [B, H, 64]

    def decode():
        return mla_ext.decode(
            q_latent, q_pe, cache.kv, cache.k_pe,
            block_table=cache.block_table, seq_lens=cache.seq_lens, sm_scale=(NOPE_DIM + ROPE_DIM) ** -0.5,
        )  # fmt: skip

    out_latent = decode().float()  # [B, H, 512]: attention-weighted sum of latents
    out = torch.einsum("bhc,hvc->bhv", out_latent, w.w_v_up)  # the value up-projection, applied once per head
    return out.reshape(x.shape[0], HEADS * V_DIM) @ w.w_o.T, decode


def attention_reference(w, history, x, positions):
    """The textbook layer in float64: per-head keys and values from each sequence's latents, softmax attention."""
    q_nope, q_pe = project_query(w, x, positions)
    outputs = []
    for seq, (latent, k_pe) in enumerate(history):  # latent [n, 512], k_pe [n, 64]
        keys = torch.einsum("jc,hnc->hjn", latent, w.w_k_up)  # [H, n, NOPE]
        values = torch.einsum("jc,hvc->hjv", latent, w.w_v_up)  # [H, n, V]
        scores = torch.einsum("hn,hjn->hj", q_nope[seq], keys) + torch.einsum("he,je->hj", q_pe[seq], k_pe)
        probs = torch.softmax(scores * (NOPE_DIM + ROPE_DIM) ** -0.5, dim=-1)
        outputs.append(torch.einsum("hj,hjv->hv", probs, values).reshape(-1))
    return torch.stack(outputs) @ w.w_o.T


def prefill(w, cache, generator):
    """Puts each prompt's tokens, through the latent projection, into the cache. Returns the float64 history the
    reference attends over: per sequence (latent [n, 512], rotary key [n, 64])."""
    history = []
    for seq, length in enumerate(PROMPT_LENS):
        x = torch.randn(length, HIDDEN, generator=generator, dtype=torch.float64)
        latent, k_pe = project_latent(w, x, torch.arange(length))
        history.append((latent, k_pe))
        cache.append(seq, latent, k_pe)
    return history


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", choices=("cuda", "cpu"), default=default_device, help="where to run")
    parser.add_argument("--steps", type=int, default=8, help="decode steps to run")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16", help="cache and query dtype")
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA is not available here; run with --device cpu")

    generator = torch.Generator().manual_seed(0)
    weights64 = LayerWeights.random(generator)  # reference copy, CPU float64
    weights = weights64.to(device, torch.float32)  # fast-path copy
    batch = len(PROMPT_LENS)
    max_pages = max(math.ceil((n + args.steps) / PAGE_SIZE) for n in PROMPT_LENS)
    num_pages = sum(math.ceil((n + args.steps) / PAGE_SIZE) for n in PROMPT_LENS) + 8  # a few pages stay unused
    cache = PagedCache(num_pages, batch, max_pages, dtype, device, generator)
    history = prefill(weights64, cache, generator)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"mla_ext demo on {name}: {args.dtype}, hidden {HIDDEN}, {HEADS} heads, latent {KV_LORA_RANK} + rope "
          f"{ROPE_DIM}, {PAGE_SIZE}-token pages, {batch} sequences, prompts {list(PROMPT_LENS)}")  # fmt: skip
    print("reference: the same layer without absorption, in float64\n")

    repeats, warmup_s = (20, 0.05) if device.type == "cuda" else (5, 0.0)
    worst = 0.0
    for step in range(1, args.steps + 1):
        # The new token of every sequence; in a model this is the previous layer's output.
        x = torch.randn(batch, HIDDEN, generator=generator, dtype=torch.float64)
        positions = torch.tensor(cache.lens)
        latent, k_pe = project_latent(weights64, x, positions)
        for seq in range(batch):
            token = (latent[seq : seq + 1], k_pe[seq : seq + 1])
            history[seq] = tuple(torch.cat([past, new]) for past, new in zip(history[seq], token, strict=True))
            cache.append(seq, *token)

        y, decode = attention_absorbed(weights, cache, x.to(device, torch.float32), positions.to(device), dtype)
        y_ref = attention_reference(weights64, history, x, positions)
        y = y.to("cpu", torch.float64)
        error = ((y - y_ref).abs().max() / y_ref.abs().max()).item() if torch.isfinite(y).all() else math.inf
        worst = max(worst, error)

        us = median_us(decode, device, repeats, warmup_s)
        rate = format_rate(decode_bytes(HEADS, cache.lens, dtype.itemsize) / us / 1e3)
        print(f"step {step:2d}  seq_lens {cache.lens}  decode {us:8.1f} us  {rate:>5} GB/s  rel err {error:.1e}")

    tolerance = TOLERANCE[args.dtype]
    verdict = "PASS" if worst <= tolerance else "FAIL"
    print(f"\n{verdict}: {args.steps} steps, worst relative error {worst:.1e} (tolerance {tolerance:.0e})")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
