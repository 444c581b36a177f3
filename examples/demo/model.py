"""A small DeepSeek-shaped MLA attention stack for the demo: random weights, a paged latent cache shared by all
layers' block table, and two attention implementations over it (mla_ext, and plain PyTorch with the same math).

Each layer is pre-norm attention with a residual: RMSNorm, the MLA projections (a 512-wide compressed KV latent and
a 64-wide rotary key shared by all heads, as in DeepSeek-V2/V3), attention in the "absorbed" form (the per-head
key up-projection folded into the query, the value up-projection applied to the output) and the output
projection. Token embeddings are tied to the LM head. One decode step (`decode_step`) touches the host only
through the page allocator, so it can be captured in a CUDA graph and replayed with new cache contents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import mla_ext
from mla_ext import HEAD_DIM, ROPE_DIM

HIDDEN = 1024
HEADS = 16
KV_LORA_RANK = HEAD_DIM  # the latent width D: the kernel supports only this one (and only its ROPE_DIM)
NOPE_DIM = 128  # per-head query/key width without the rotary part
V_DIM = 128  # per-head value width
ROPE_BASE = 10000.0
PAGE_SIZE = 64
VOCAB = 4096
SM_SCALE = (NOPE_DIM + ROPE_DIM) ** -0.5  # the model's softmax scale (its per-head query width), not 576 ** -0.5
CACHE_DIM = KV_LORA_RANK + ROPE_DIM  # values cached per token: latent, then rotary key


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [HIDDEN]
    w_q: torch.Tensor  # [H * (NOPE + ROPE), HIDDEN]
    w_kv_down: torch.Tensor  # [KV_LORA_RANK + ROPE, HIDDEN]: token -> (latent, rotary key)
    kv_norm: torch.Tensor  # [KV_LORA_RANK]: RMSNorm gain on the latent
    w_k_up: torch.Tensor  # [H, NOPE, KV_LORA_RANK]: latent -> per-head key
    w_v_up: torch.Tensor  # [H, V_DIM, KV_LORA_RANK]: latent -> per-head value
    w_o: torch.Tensor  # [HIDDEN, H * V_DIM]


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [VOCAB, HIDDEN], also the LM head
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [HIDDEN]

    @staticmethod
    def random(num_layers, generator):
        """float64 weights scaled so activations stay O(1)."""

        def weight(*shape):
            return torch.randn(*shape, generator=generator, dtype=torch.float64) / math.sqrt(shape[-1])

        def gain(size):
            return 1 + 0.1 * torch.randn(size, generator=generator, dtype=torch.float64)

        layers = [
            LayerWeights(
                attn_norm=gain(HIDDEN),
                w_q=weight(HEADS * (NOPE_DIM + ROPE_DIM), HIDDEN),
                w_kv_down=weight(CACHE_DIM, HIDDEN),
                kv_norm=gain(KV_LORA_RANK),
                w_k_up=weight(HEADS, NOPE_DIM, KV_LORA_RANK),
                w_v_up=weight(HEADS, V_DIM, KV_LORA_RANK),
                w_o=weight(HIDDEN, HEADS * V_DIM) / math.sqrt(num_layers),  # keeps the residual stream O(1)
            )
            for _ in range(num_layers)
        ]
        embed = torch.randn(VOCAB, HIDDEN, generator=generator, dtype=torch.float64)
        return ModelWeights(embed=embed, layers=layers, final_norm=gain(HIDDEN))

    def to(self, device, dtype):
        def cast(t):
            return t.to(device, dtype)

        layers = [LayerWeights(**{name: cast(t) for name, t in vars(layer).items()}) for layer in self.layers]
        return ModelWeights(embed=cast(self.embed), layers=layers, final_norm=cast(self.final_norm))


def rms_norm(x, gain, eps=1e-6):
    """RMSNorm computed in at least fp32, returned in x's dtype."""
    wide = x if x.dtype == torch.float64 else x.float()
    return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps) * gain.to(wide.dtype)).to(x.dtype)


def rope(x, positions):
    """Rotary embedding of x [..., 64] at integer positions shaped like x[..., 0] (rotate-half convention)."""
    half = ROPE_DIM // 2
    freqs = ROPE_BASE ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    angles = positions.to(torch.float64)[..., None] * freqs
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def project_query(w, h, positions):
    """h [B, HIDDEN] at positions [B] -> q_nope [B, H, NOPE], q_pe [B, H, ROPE]."""
    q = (h @ w.w_q.T).view(-1, HEADS, NOPE_DIM + ROPE_DIM)
    return q[..., :NOPE_DIM], rope(q[..., NOPE_DIM:], positions[:, None].expand(-1, HEADS))


def project_latent(w, h, positions):
    """h [N, HIDDEN] at positions [N] -> what the cache stores per token: latent [N, 512], rotary key [N, 64]."""
    down = h @ w.w_kv_down.T
    return rms_norm(down[:, :KV_LORA_RANK], w.kv_norm), rope(down[:, KV_LORA_RANK:], positions)


class PagedCache:
    """Every layer's latents in its own pool of fixed-size pages; one block table and seq_lens for all layers.

    Page i of sequence b is pool[block_table[b, i]] in every layer. Pages are handed out in shuffled order, so a
    sequence's pages are scattered over the pool, as they are after a server has run for a while. The device
    tensors are updated in place (reset, new pages, lengths), so a captured CUDA graph keeps seeing them.
    """

    def __init__(self, prompts, max_new_tokens, num_layers, dtype, device, fill, generator):
        """prompts: per layer, per sequence, the cached rows [n, 576] of the prompt (a prefill's leftovers).
        fill: the value of slots and table entries that hold nothing (NaN / -1 prove they are never read)."""
        self.prompts = prompts
        batch = len(prompts[0])
        pages_per_seq = [math.ceil((len(p) + max_new_tokens) / PAGE_SIZE) for p in prompts[0]]
        num_pages = sum(pages_per_seq) + 4  # a few pages stay unused
        self.fill = fill
        self.pools = [torch.empty(num_pages, PAGE_SIZE, CACHE_DIM, dtype=dtype, device=device)
                      for _ in range(num_layers)]  # fmt: skip
        self.block_table = torch.empty(batch, max(pages_per_seq), dtype=torch.int32, device=device)  # [B, max_pages]
        self.seq_lens = torch.empty(batch, dtype=torch.int32, device=device)  # [B]
        self.positions = torch.empty(batch, dtype=torch.int64, device=device)  # [B]: where this step's token goes
        self.page_order = torch.randperm(num_pages, generator=generator).tolist()
        self.reset()

    def reset(self):
        """Back to the prompts only, in place."""
        for pool in self.pools:
            pool.fill_(self.fill)
        self.block_table.fill_(-1 if math.isnan(self.fill) else 0)
        self.free_pages = list(self.page_order)
        self.pages = [[] for _ in self.prompts[0]]  # host copy of each sequence's page list
        self.lens = [0] * len(self.prompts[0])  # host copy of seq_lens after the next step's token
        for seq in range(len(self.lens)):
            length = len(self.prompts[0][seq])
            for pos in range(length):
                self._take_page_if_needed(seq, pos)
            slots = torch.tensor(self._slots(seq, 0, length), device=self.seq_lens.device)
            for pool, prompt in zip(self.pools, self.prompts, strict=True):
                pool.view(-1, CACHE_DIM).index_copy_(0, slots, prompt[seq].to(pool.device, pool.dtype))
            self.lens[seq] = length
        self.seq_lens.copy_(torch.tensor(self.lens, dtype=torch.int32))

    def _take_page_if_needed(self, seq, pos):
        if pos % PAGE_SIZE == 0:
            page = self.free_pages.pop()
            self.block_table[seq, len(self.pages[seq])] = page
            self.pages[seq].append(page)

    def _slots(self, seq, start, stop):
        return [self.pages[seq][pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE for pos in range(start, stop)]

    def reserve_next_token(self):
        """Host side of a decode step (the scheduler's job): a fresh page for every sequence whose next token
        starts one. Runs before the step; the step itself advances seq_lens on the device."""
        for seq, length in enumerate(self.lens):
            self._take_page_if_needed(seq, length)
            self.lens[seq] = length + 1

    def advance(self):
        """Device side: this step's positions are the old lengths; every sequence grows by one token."""
        self.positions.copy_(self.seq_lens)
        self.seq_lens.add_(1)

    def write(self, layer, latent, k_pe):
        """Stores this step's token of every sequence: latent [B, 512], k_pe [B, 64], at self.positions."""
        rows = torch.arange(self.positions.shape[0], device=self.positions.device)
        page = self.block_table[rows, self.positions // PAGE_SIZE].long()
        slots = page * PAGE_SIZE + self.positions % PAGE_SIZE  # [B]
        pool = self.pools[layer]
        pool.view(-1, CACHE_DIM).index_copy_(0, slots, torch.cat([latent, k_pe], dim=-1).to(pool.dtype))


def attend_mla_ext(q_latent, q_pe, cache, layer):
    """mla_ext over the paged cache: q_latent [B, H, 512], q_pe [B, H, 64] -> [B, H, 512]."""
    pool = cache.pools[layer]
    return mla_ext.decode(
        q_latent, q_pe, pool[..., :KV_LORA_RANK], pool[..., KV_LORA_RANK:],
        block_table=cache.block_table, seq_lens=cache.seq_lens, sm_scale=SM_SCALE,
    )  # fmt: skip


def attend_eager(q_latent, q_pe, cache, layer):
    """The same attention in plain PyTorch: gather the pages, bmm, masked softmax, bmm. Its pool must hold finite
    values in unused slots (a masked probability of 0 still multiplies the stored value)."""
    keys = cache.pools[layer][cache.block_table.long()].flatten(1, 2)  # [B, max_pages * PAGE_SIZE, 576]
    scores = torch.bmm(torch.cat([q_latent, q_pe], dim=-1), keys.transpose(1, 2)).float() * SM_SCALE  # [B, H, C]
    visible = torch.arange(keys.shape[1], device=keys.device)[None, :] < cache.seq_lens[:, None]  # [B, C]
    probs = torch.softmax(scores.masked_fill(~visible[:, None, :], -math.inf), dim=-1).to(keys.dtype)
    return torch.bmm(probs, keys[..., :KV_LORA_RANK])


ATTENTION = {"mla_ext": (attend_mla_ext, math.nan), "eager": (attend_eager, 0.0)}  # (function, cache fill)


def decode_step(weights, cache, tokens, attend):
    """One token for every sequence: tokens [B] -> logits [B, VOCAB] (fp32). Appends to the cache of every layer."""
    cache.advance()
    x = weights.embed[tokens]  # [B, HIDDEN]
    for layer, w in enumerate(weights.layers):
        h = rms_norm(x, w.attn_norm)
        q_nope, q_pe = project_query(w, h, cache.positions)
        cache.write(layer, *project_latent(w, h, cache.positions))
        q_latent = torch.bmm(q_nope.transpose(0, 1), w.w_k_up).transpose(0, 1)  # absorb W_uk: [B, H, 512]
        out_latent = attend(q_latent, q_pe.contiguous(), cache, layer)  # [B, H, 512]
        out = torch.bmm(out_latent.transpose(0, 1), w.w_v_up.transpose(1, 2)).transpose(0, 1)  # [B, H, V_DIM]
        x = x + out.reshape(x.shape[0], HEADS * V_DIM) @ w.w_o.T
    return (rms_norm(x, weights.final_norm) @ weights.embed.T).float()
