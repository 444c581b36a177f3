"""What a serving engine relies on: no host synchronisation on the CUDA path, a model layer under
torch.compile(mode="reduce-overhead") (CUDA graphs through Inductor), and batch invariance on the shapes served
(H=128 and its kernel, 64-token pages, fp16, multi-token decode) whatever the other sequences are."""

from __future__ import annotations

import contextlib
import importlib.util
import math

import pytest
import torch

import mla_ext
from tests.support.axes import DTYPE_IDS, requires_cuda
from tests.support.checks import relative_error
from tests.support.make_inputs import empty_outputs_like, make_problem, random_states


@contextlib.contextmanager
def host_sync_is_an_error():
    """Any synchronising CUDA call inside raises (torch.cuda.set_sync_debug_mode); the mode is restored after."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@requires_cuda
@pytest.mark.parametrize("kv_len_per_split", [None, 64], ids=["auto-split", "split-64"])
@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "paged"])
@pytest.mark.parametrize("num_heads, seqlen_q", [(16, 1), (128, 1), (16, 2)], ids=["H16", "H128", "H16-Sq2"])
def test_decode_ops_never_sync_with_host(num_heads, seqlen_q, page_size, kv_len_per_split, gen):
    problem = make_problem(
        gen,
        device="cuda",
        dtype=torch.bfloat16,
        lens=[300, 0, 17, 129],
        num_heads=num_heads,
        seqlen_q=seqlen_q,
        causal=seqlen_q > 1,
        page_size=page_size,
        dense_seq_lens=True,
    )
    kwargs = problem.kwargs(kv_len_per_split=kv_len_per_split)
    out, lse = empty_outputs_like(problem.q)
    with host_sync_is_an_error():
        plain = torch.ops.mla.decode(*problem.args(), **kwargs)
        with_lse = torch.ops.mla.decode_with_lse(*problem.args(), **kwargs)
        torch.ops.mla.decode_out(*problem.args(), **kwargs, out=out, lse=lse)
        wrapped = mla_ext.decode(*problem.args(), **kwargs, return_lse=True)
        merged = mla_ext.merge_states(*with_lse, *wrapped)
    torch.cuda.synchronize()
    assert torch.equal(plain, with_lse[0]) and torch.equal(out, plain) and torch.equal(lse, with_lse[1])
    assert torch.equal(wrapped[0], plain)
    # Merging a result with itself keeps out and adds log 2 to lse (rows with no key stay 0 / -inf).
    assert relative_error(merged[0], plain) <= 1e-2
    finite = torch.isfinite(lse)
    assert torch.allclose(merged[1][finite], lse[finite] + math.log(2), atol=1e-5)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=DTYPE_IDS.get)
def test_merge_states_never_syncs(dtype, gen):
    states = [random_states(gen, (4, 2, 16), dtype, "cuda") for _ in range(2)]
    with host_sync_is_an_error():
        out, lse = mla_ext.merge_states(*states[0], *states[1])
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


class TinyMLALayer(torch.nn.Module):
    """Absorbed MLA attention over a paged latent cache held as a buffer (a static address for CUDA graphs)."""

    def __init__(self, hidden, heads, num_pages, page_size, dtype, gen):
        super().__init__()

        def weight(*shape):
            values = (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(dtype)
            return torch.nn.Parameter(values, requires_grad=False)  # inference weights

        self.heads = heads
        self.w_q = weight(heads * 576, hidden)  # [H * (512 + 64), hidden]: absorbed latent query and rope query
        self.w_o = weight(hidden, heads * 512)  # [hidden, H * 512]: value up-projection folded into the output
        cache = torch.randn(num_pages, page_size, 576, generator=gen).to(dtype)
        self.register_buffer("cache", cache)  # [P, page_size, 576]

    def forward(self, x, block_table, seq_lens):
        q = (x @ self.w_q.T).view(x.shape[0], self.heads, 576)
        out = mla_ext.decode(q[..., :512], q[..., 512:], self.cache[..., :512], self.cache[..., 512:],
                             block_table=block_table, seq_lens=seq_lens)  # fmt: skip
        return x + out.flatten(1) @ self.w_o.T


@requires_cuda
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton for Inductor")
def test_reduce_overhead_compile_matches_eager(gen):
    """torch.compile(mode="reduce-overhead") captures the layer, decode included, in a CUDA graph; replays follow
    new seq_lens, block_table contents and cache rows, and match the eager layer."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    batch, page_size, max_pages = 4, 16, 8
    num_pages = batch * max_pages
    layer = TinyMLALayer(256, 16, num_pages, page_size, torch.bfloat16, gen).cuda()
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    pages = torch.randperm(num_pages, generator=gen).view(batch, max_pages).to(torch.int32)
    block_table = pages.cuda()
    seq_lens = torch.zeros(batch, dtype=torch.int32, device="cuda")
    for step, lens in enumerate([[128, 1, 60, 17], [0, 128, 33, 2], [5, 7, 128, 0], [64, 64, 64, 64], [1, 0, 1, 9]]):
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        block_table.copy_(pages.roll(step, dims=0))  # every sequence moves to other pages
        layer.cache[step % num_pages].normal_()  # the cache changes between steps too
        x = torch.randn(batch, 256, generator=gen).to("cuda", torch.bfloat16)
        with torch.no_grad():  # as a serving loop runs it (the ops have no backward to trace)
            got = compiled(x, block_table, seq_lens).clone()  # the graph's output is overwritten by the next replay
            want = layer(x, block_table, seq_lens)
        assert relative_error(got, want) <= 2e-2, f"step {step}: compiled layer differs from eager"
    assert counters["inductor"]["cudagraph_skips"] == 0, "Inductor skipped CUDA graphs for the layer"


SERVING_SHAPES = {
    "H128-page64-fp16": dict(num_heads=128, page_size=64, dtype=torch.float16),
    "H128-dense-bf16-Sq2": dict(num_heads=128, page_size=None, dtype=torch.bfloat16, seqlen_q=2, causal=True),
    "H16-page64-bf16": dict(num_heads=16, page_size=64, dtype=torch.bfloat16),
    "H1-page1-fp16": dict(num_heads=1, page_size=1, dtype=torch.float16),
}


@pytest.mark.parametrize("shape", list(SERVING_SHAPES))
def test_batch_invariant_whatever_the_companions(shape, device, gen):
    """With a fixed kv_len_per_split, one sequence's out and lse are bitwise the same in three batches that differ
    in size, in its position and in every other sequence (the capacity, the block table's width, stays fixed, as
    it does under CUDA graphs); and repeated calls are bitwise identical."""
    options = dict(SERVING_SHAPES[shape])
    dtype, page_size = options.pop("dtype"), options["page_size"]
    capacity, mine = 320, 250
    batches = [([mine], 0), ([1, 320, mine, 0, 77], 2), ([mine, 5, 5, 319, 128, 64, 200], 0)]  # (lens, where)
    results = []
    for lens, where in batches:
        problem = make_problem(gen, device=device, dtype=dtype, lens=lens, dense_slack=capacity - max(lens),
                               spare_slots=0, dense_seq_lens=True, **options)  # fmt: skip
        if page_size:  # widen every table to the same capacity with out-of-range entries
            width = math.ceil(capacity / page_size)
            pad = torch.full((len(lens), width - problem.block_table.shape[1]), -1, dtype=torch.int32, device=device)
            problem.block_table = torch.cat([problem.block_table, pad], dim=1)
        results.append((problem, where))
    reference_problem, reference_where = results[0]
    outputs = []
    for problem, where in results:
        copy_sequence(reference_problem, reference_where, problem, where)
        kwargs = problem.kwargs(kv_len_per_split=64)
        out, lse = mla_ext.decode(*problem.args(), return_lse=True, **kwargs)
        again = mla_ext.decode(*problem.args(), return_lse=True, **kwargs)
        assert torch.equal(out, again[0]) and torch.equal(lse, again[1]), "repeated calls differ"
        outputs.append((out[where], lse[where]))
    for index, (out, lse) in enumerate(outputs[1:], 1):
        assert torch.equal(out, outputs[0][0]) and torch.equal(lse, outputs[0][1]), f"batch {index} differs"


def copy_sequence(source, src, target, dst):
    """Gives sequence dst of `target` the queries and keys of sequence src of `source` (same length)."""
    target.q[dst], target.q_pe[dst] = source.q[src], source.q_pe[src]
    if source.block_table is None:
        target.kv[dst], target.k_pe[dst] = source.kv[src], source.k_pe[src]
        return
    length = int(source.seq_lens[src])
    page_size = source.kv.shape[1]
    for i in range(math.ceil(length / page_size)):
        src_page, dst_page = int(source.block_table[src, i]), int(target.block_table[dst, i])
        target.kv[dst_page], target.k_pe[dst_page] = source.kv[src_page], source.k_pe[src_page]
