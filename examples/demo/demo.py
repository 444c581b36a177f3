"""Generate tokens with a small DeepSeek-shaped MLA attention stack whose attention runs on mla_ext over a paged KV
cache, next to the same stack in plain PyTorch.

    python3 -m examples.demo.demo [--device cuda|cpu] [--dtype bf16|fp16|fp32] [--steps 16] [--layers 4]
                                  [--batch B --prompt-len L] [--graphs]

Run it from the repository root. The stack (examples/demo/model.py) has random weights (nothing is downloaded):
hidden size 1024, 16 heads, a 512-wide compressed KV latent and a 64-wide rotary key per token, as in
DeepSeek-V2/V3. The prompts' cache rows are what a prefill would have left (latents of random hidden states); then
every decode step appends each sequence's new token to every layer's cache, handing out a fresh page from a shuffled
pool when a sequence crosses a page boundary, and the model picks the next token greedily.

1. Check: the mla_ext stack generates; the plain-PyTorch stack (the same absorbed math with bmm + softmax) and a
   float64 textbook stack (per-head keys and values, no absorption; examples/demo/reference.py) are fed the same
   tokens, and their logits are compared at every step. mla_ext's unused cache slots hold NaN, so a kernel that
   read past a sequence's end would fail the check.
2. Speed: each stack generates `--steps` tokens from the prompts; tokens/s counts every sequence's tokens. With
   `--graphs` (CUDA) each stack also runs with one decode step captured in a CUDA graph: the step reads the
   block table and seq_lens from static buffers that the host updates in place before each replay.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from examples.demo.model import (
    ATTENTION,
    HEADS,
    HIDDEN,
    KV_LORA_RANK,
    PAGE_SIZE,
    ROPE_DIM,
    VOCAB,
    ModelWeights,
    PagedCache,
    decode_step,
    project_latent,
)
from examples.demo.reference import TextbookReference

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_PROMPTS = (63, 250, 1024, 1777)  # 63 and 1024 make the first step open a fresh page
# Bound on max|logits - ref| / max|ref| (errors of every layer add up in the residual stream).
TOLERANCE = {"bf16": 1.5e-2, "fp16": 3e-3, "fp32": 2e-5}
LABELS = {"eager": "PyTorch eager", "mla_ext": "mla_ext"}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", choices=("cuda", "cpu"), default=default_device, help="where to run")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16", help="weights, cache and query dtype")
    parser.add_argument("--steps", type=int, default=16, help="tokens to generate per sequence")
    parser.add_argument("--layers", type=int, default=4, help="attention layers in the stack")
    parser.add_argument("--batch", type=int, help=f"sequences (default: {len(DEFAULT_PROMPTS)} with prompts "
                        f"{list(DEFAULT_PROMPTS)})")  # fmt: skip
    parser.add_argument("--prompt-len", type=int, default=2048, help="longest prompt when --batch is given")
    parser.add_argument("--graphs", action="store_true", help="also time one decode step per CUDA graph")
    parser.add_argument("--check-seqs", type=int, default=4, help="sequences the float64 reference follows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available here; run with --device cpu")
    if args.graphs and args.device != "cuda":
        parser.error("--graphs needs --device cuda")
    return args


def prompt_lens(args):
    """Varied lengths up to --prompt-len, every other one just short of a page boundary."""
    if args.batch is None:
        return list(DEFAULT_PROMPTS)
    lens = [max(1, args.prompt_len * (i + 1) // args.batch) for i in range(args.batch)]
    return [max(1, n - n % PAGE_SIZE - 1) if i % 2 else n for i, n in enumerate(lens)]


def make_prompts(weights, lens, dtype, device, seed):
    """Per layer, per sequence: the cached rows [n, 576] of the prompt, in the cache's dtype."""
    generator = torch.Generator(device=device).manual_seed(seed)
    exact = weights.to(device, torch.float64)
    prompts = []
    for w in exact.layers:
        rows = []
        for n in lens:
            hidden = torch.randn(n, HIDDEN, generator=generator, device=device, dtype=torch.float64)
            rows.append(torch.cat(project_latent(w, hidden, torch.arange(n, device=device)), dim=-1).to(dtype))
        prompts.append(rows)
    return prompts


def relative_error(actual, expected):
    actual, expected = actual.double(), expected.double().to(actual.device)
    if not torch.isfinite(actual).all():
        return math.inf
    return ((actual - expected).abs().max() / expected.abs().max()).item()


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check(weights, caches, reference, start, steps):
    """Lockstep generation, mla_ext choosing the tokens; returns (worst errors by pair, greedy agreement)."""
    tokens, worst, agree = start, {"mla_ext": 0.0, "eager": 0.0, "pair": 0.0}, 0
    rows = reference.rows
    for step in range(1, steps + 1):
        logits = {}
        for name, (attend, _) in ATTENTION.items():
            caches[name].reserve_next_token()
            logits[name] = decode_step(weights, caches[name], tokens, attend)
        ref = reference.step(tokens)
        errors = {
            "mla_ext": relative_error(logits["mla_ext"][rows], ref),
            "eager": relative_error(logits["eager"][rows], ref),
            "pair": relative_error(logits["mla_ext"], logits["eager"]),
        }
        worst = {key: max(worst[key], value) for key, value in errors.items()}
        tokens = logits["mla_ext"].argmax(-1)
        agree += int((tokens == logits["eager"].argmax(-1)).sum())
        lens = caches["mla_ext"].lens
        shown = lens if len(lens) <= 6 else f"{min(lens)}..{max(lens)}"
        print(f"step {step:3d}  seq_lens {shown}  logits err vs float64: mla_ext {errors['mla_ext']:.1e}, eager "
              f"{errors['eager']:.1e}; mla_ext vs eager {errors['pair']:.1e}", flush=True)  # fmt: skip
    return worst, agree / (steps * start.shape[0])


def generate(weights, cache, attend, start, steps, use_graph):
    """Greedy generation of `steps` tokens from the prompts: (tokens/s, generated tokens [B, steps] on the CPU)."""
    device = start.device
    tokens = start.clone()  # [B]: the step's input, overwritten with its output (a static buffer for graphs)
    generated = torch.empty(start.shape[0], steps, dtype=torch.long, device=device)

    def step():
        tokens.copy_(decode_step(weights, cache, tokens, attend).argmax(-1))

    run = step
    if use_graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the capture (it grows the cache; reset below)
            for _ in range(2):
                cache.reserve_next_token()
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    cache.reset()
    tokens.copy_(start)
    synchronize(device)
    begin = time.perf_counter()
    for index in range(steps):
        cache.reserve_next_token()  # the scheduler: a page for every sequence that needs one
        run()
        generated[:, index] = tokens
    synchronize(device)
    elapsed = time.perf_counter() - begin
    return start.shape[0] * steps / elapsed, generated.cpu()


def main(argv=None):
    args = parse_args(argv)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    generator = torch.Generator().manual_seed(args.seed)
    weights = ModelWeights.random(args.layers, generator).to(device, dtype)
    lens = prompt_lens(args)
    batch = len(lens)
    prompts = make_prompts(weights, lens, dtype, device, args.seed)
    # Room for the checked steps, or the graph warm-up's 2 steps past them, before a reset.
    caches = {name: PagedCache(prompts, args.steps + 2, args.layers, dtype, device, fill, generator)
              for name, (_, fill) in ATTENTION.items()}  # fmt: skip
    count = min(batch, args.check_seqs)
    rows = sorted({round(i * (batch - 1) / max(1, count - 1)) for i in range(count)})
    reference = TextbookReference(weights, prompts, rows, args.steps, device)
    start = torch.randint(VOCAB, (batch,), generator=generator).to(device)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    shown = lens if batch <= 6 else f"{min(lens)}..{max(lens)} ({sum(lens)} tokens)"
    print(f"mla_ext demo on {name}: {args.dtype}, {args.layers} MLA layers (hidden {HIDDEN}, {HEADS} heads, "
          f"latent {KV_LORA_RANK} + rope {ROPE_DIM}), {PAGE_SIZE}-token pages, {batch} sequences, "
          f"prompts {shown}")  # fmt: skip
    print(f"check: logits of mla_ext and plain PyTorch vs a float64 textbook stack on sequences {rows}\n")
    worst, agreement = check(weights, caches, reference, start, args.steps)

    print(f"\nspeed: {args.steps} tokens per sequence from the prompts, {batch} sequences")
    results = {}
    for graphs in (False, True) if args.graphs else (False,):
        for method in ("eager", "mla_ext"):
            results[method, graphs] = generate(weights, caches[method], ATTENTION[method][0], start, args.steps, graphs)
            rate = results[method, graphs][0]
            label = LABELS[method] + (" + CUDA graphs" if graphs else "")
            ratio = f"  ({rate / results['eager', graphs][0]:.2f}x eager)" if method == "mla_ext" else ""
            print(f"  {label:<28} {rate:10.1f} tokens/s  {1e3 * batch / rate:8.2f} ms/step{ratio}", flush=True)

    tolerance = TOLERANCE[args.dtype]
    failures = [f"{key} error {value:.1e} > {tolerance:.0e}" for key, value in worst.items() if value > tolerance]
    if args.graphs:
        for method in ("eager", "mla_ext"):
            if not torch.equal(results[method, True][1], results[method, False][1]):
                failures.append(f"{LABELS[method]}: CUDA graph replays generated other tokens than plain calls")
    print(f"\ngreedy tokens of mla_ext and eager agree on {100 * agreement:.1f}% of the steps (near-ties may flip)")
    print(f"worst logits error vs float64: mla_ext {worst['mla_ext']:.1e}, eager {worst['eager']:.1e} "
          f"(tolerance {tolerance:.0e}); mla_ext vs eager {worst['pair']:.1e}")  # fmt: skip
    for failure in failures:
        print(f"FAIL: {failure}")
    print("PASS" if not failures else "FAIL")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
