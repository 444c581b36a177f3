"""Smoke test of an installed mla_ext: it imports, says what it was built against, and torch.ops.mla.decode
matches a float64 softmax-attention reference on CPU (and on CUDA when a GPU is present).

    python scripts/smoke_test.py                       # the mla_ext found on sys.path
    python scripts/smoke_test.py --expect-under DIR    # also fail unless that mla_ext lives under DIR
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch


def reference(q, q_pe, kv, k_pe, seq_lens):
    """Absorbed MLA decode in float64: q [B, H, D], kv [B, S, D], seq_lens [B] -> out [B, H, D], lse [B, H]."""
    q, q_pe, kv, k_pe = (t.double() for t in (q, q_pe, kv, k_pe))
    scores = (q @ kv.transpose(1, 2) + q_pe @ k_pe.transpose(1, 2)) / math.sqrt(q.shape[-1] + q_pe.shape[-1])
    visible = torch.arange(kv.shape[1]) < seq_lens.long().cpu()[:, None]  # [B, S]
    scores = scores.masked_fill(~visible[:, None, :].to(scores.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ kv, torch.logsumexp(scores, dim=-1)


def check_device(device: str) -> None:
    import mla_ext

    gen = torch.Generator().manual_seed(0)
    batch, heads, keys = 3, 16, 300
    head_dim, rope_dim = mla_ext.HEAD_DIM, mla_ext.ROPE_DIM
    q, q_pe = torch.randn(batch, heads, head_dim, generator=gen), torch.randn(batch, heads, rope_dim, generator=gen)
    kv, k_pe = torch.randn(batch, keys, head_dim, generator=gen), torch.randn(batch, keys, rope_dim, generator=gen)
    seq_lens = torch.tensor([keys, 129, 1], dtype=torch.int32)
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        args = [t.to(device, dtype) for t in (q, q_pe, kv, k_pe)]
        expected_out, expected_lse = reference(*(t.cpu() for t in args), seq_lens)  # from the rounded inputs
        out = torch.ops.mla.decode(*args, seq_lens=seq_lens.to(device))
        _, lse = mla_ext.decode(*args, seq_lens=seq_lens.to(device), return_lse=True)
        out_error = (out.double().cpu() - expected_out).abs().max().item()
        lse_error = (lse.double().cpu() - expected_lse).abs().max().item()
        print(f"  {device} {str(dtype).removeprefix('torch.')}: max |out error| {out_error:.2e}, "
              f"max |lse error| {lse_error:.2e}")
        if not (out_error < tolerance and lse_error < 1e-3):
            raise SystemExit(f"smoke test failed on {device} {dtype}: errors {out_error:.2e} / {lse_error:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expect-under", type=Path, help="fail unless the imported mla_ext lives under this folder")
    args = parser.parse_args()

    import mla_ext

    location = Path(mla_ext.__file__).resolve().parent
    print(f"mla_ext from {location}")
    print(f"  {mla_ext.build_info}")
    if args.expect_under is not None and not location.is_relative_to(args.expect_under.resolve()):
        raise SystemExit(f"smoke test imported mla_ext from {location}, not from under {args.expect_under}")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        check_device(device)
    print(f"smoke test: {len(devices)} passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
