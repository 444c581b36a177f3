"""The demo's float64 reference: the same stack written the textbook way, without absorption.

Each layer up-projects every cached latent into per-head keys and values once (the cache a plain multi-head
attention layer would keep) and runs softmax attention per head. It reads the prompts' cached rows exactly as the
demo's caches store them (rounded to the demo's dtype) and uses the same rounded weights, so what remains between
it and the fast paths is their arithmetic. Sequences are independent, so it follows only a few of them.
"""

from __future__ import annotations

import torch

from examples.demo.model import HEADS, KV_LORA_RANK, NOPE_DIM, SM_SCALE, V_DIM, project_latent, project_query, rms_norm

F64 = torch.float64


class TextbookReference:
    def __init__(self, weights, prompts, rows, max_new_tokens, device):
        """weights: ModelWeights (any dtype; used in float64); prompts: per layer, per sequence, cached rows
        [n, 576]; rows: the sequences to follow."""
        self.weights = weights.to(device, F64)
        self.rows = list(rows)
        self.lens = [len(prompts[0][b]) for b in self.rows]
        self.keys, self.keys_pe, self.values = [], [], []  # per layer, per row: [H, cap, NOPE], [cap, 64], [H, cap, V]
        for layer, w in enumerate(self.weights.layers):
            keys, keys_pe, values = [], [], []
            for b, length in zip(self.rows, self.lens, strict=True):
                cap = length + max_new_tokens
                cached = prompts[layer][b].to(device, F64)  # [n, 576]
                keys.append(torch.empty(HEADS, cap, NOPE_DIM, dtype=F64, device=device))
                keys_pe.append(torch.empty(cap, cached.shape[1] - KV_LORA_RANK, dtype=F64, device=device))
                values.append(torch.empty(HEADS, cap, V_DIM, dtype=F64, device=device))
                self._store(w, keys[-1], keys_pe[-1], values[-1], 0, cached[:, :KV_LORA_RANK], cached[:, KV_LORA_RANK:])
            self.keys.append(keys)
            self.keys_pe.append(keys_pe)
            self.values.append(values)

    @staticmethod
    def _store(w, keys, keys_pe, values, start, latent, k_pe):
        """Up-projects latent [n, 512] into per-head keys and values at positions start..start+n."""
        stop = start + latent.shape[0]
        keys[:, start:stop] = torch.einsum("jc,hnc->hjn", latent, w.w_k_up)
        values[:, start:stop] = torch.einsum("jc,hvc->hjv", latent, w.w_v_up)
        keys_pe[start:stop] = k_pe

    def step(self, tokens):
        """tokens [B] (the whole batch's inputs) -> float64 logits [len(rows), VOCAB] of the followed rows."""
        device = self.weights.embed.device
        positions = torch.tensor(self.lens, device=device)
        x = self.weights.embed[tokens[self.rows].to(device)]  # [R, HIDDEN]
        for layer, w in enumerate(self.weights.layers):
            h = rms_norm(x, w.attn_norm)
            q_nope, q_pe = project_query(w, h, positions)
            latent, k_pe = project_latent(w, h, positions)
            outputs = []
            for i, length in enumerate(self.lens):
                keys, keys_pe, values = self.keys[layer][i], self.keys_pe[layer][i], self.values[layer][i]
                self._store(w, keys, keys_pe, values, length, latent[i : i + 1], k_pe[i : i + 1])
                n = length + 1
                scores = torch.einsum("hn,hjn->hj", q_nope[i], keys[:, :n]) + q_pe[i] @ keys_pe[:n].T  # [H, n]
                probs = torch.softmax(scores * SM_SCALE, dim=-1)
                outputs.append(torch.einsum("hj,hjv->hv", probs, values[:, :n]).reshape(-1))
            x = x + torch.stack(outputs) @ w.w_o.T
        self.lens = [length + 1 for length in self.lens]
        return rms_norm(x, self.weights.final_norm) @ self.weights.embed.T
