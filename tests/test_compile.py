"""The ops under torch.library.opcheck, and torch.compile(fullgraph=True, dynamic=True) with no recompilation."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import mla_ext
from tests.support.axes import DTYPE_IDS, DTYPES
from tests.support.make_inputs import empty_outputs_like, make_problem, random_states

VARIANTS = {
    "dense": dict(lens=[100, 100], num_heads=16),
    "dense-varlen": dict(lens=[100, 0, 37], num_heads=8, dense_slack=5),
    "paged-causal": dict(lens=[70, 1, 33], num_heads=24, seqlen_q=2, causal=True, page_size=16),
}


def opcheck_problem(gen, device, dtype, variant):
    return make_problem(gen, device=device, dtype=dtype, **VARIANTS[variant])


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("op", ["decode", "decode_with_lse", "decode_out"])
def test_opcheck_decode_ops(op, dtype, variant, device, gen):
    problem = opcheck_problem(gen, device, dtype, variant)
    kwargs = problem.kwargs(kv_len_per_split=32)
    if op == "decode_out":
        out, lse = empty_outputs_like(problem.q)
        kwargs.update(out=out, lse=lse)
    torch.library.opcheck(getattr(torch.ops.mla, op).default, problem.args(), kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_opcheck_merge_states(dtype, device, gen):
    out_a, lse_a = random_states(gen, (3, 16), dtype, device)
    out_b, lse_b = random_states(gen, (3, 16), dtype, device)
    torch.library.opcheck(torch.ops.mla.merge_states.default, (out_a, lse_a, out_b, lse_b))


def serving_step(q, q_pe, kv, k_pe, block_table, seq_lens):
    """A decode surrounded by other work, as a model's attention layer would call it."""
    out, lse = mla_ext.decode(
        q * 0.5, q_pe, kv, k_pe, block_table=block_table, seq_lens=seq_lens, return_lse=True, causal=True
    )
    return out.float() + 1.0, lse


@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "paged"])
def test_compile_dynamic_shapes_without_recompiling(page_size, device, gen):
    """One compiled graph serves every batch size and cache length; each result equals eager bit for bit."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(serving_step, backend=counter, fullgraph=True, dynamic=True)
    # The first call's sizes are all distinct, so duck sizing ties no two dims together.
    for lens in ([100, 40], [257, 3, 80, 20], [64, 64, 0, 5, 9]):
        problem = make_problem(
            gen,
            device=device,
            dtype=torch.bfloat16,
            lens=lens,
            num_heads=16,
            seqlen_q=3,
            causal=True,
            page_size=page_size,
            dense_seq_lens=True,
            dense_slack=len(lens),
        )
        args = (*problem.args(), problem.block_table, problem.seq_lens)
        got_out, got_lse = compiled(*args)
        want_out, want_lse = serving_step(*args)
        assert torch.equal(got_out, want_out) and torch.equal(got_lse, want_lse), f"lens {lens}"
    assert counter.frame_count == 1, f"compiled {counter.frame_count} times for 3 shapes"


def test_compile_decode_into_given_output(device, gen):
    """The out= form (decode_out underneath) traces too, and fills the caller's buffer."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def step(q, q_pe, kv, k_pe, seq_lens, out):
        mla_ext.decode(q, q_pe, kv, k_pe, seq_lens=seq_lens, out=out)
        return out

    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    for lens in ([90, 12], [33, 0, 200]):
        problem = make_problem(gen, device=device, dtype=torch.float16, lens=lens, num_heads=8, dense_seq_lens=True)
        out, _ = empty_outputs_like(problem.q)
        compiled(*problem.args(), problem.seq_lens, out)
        want = torch.ops.mla.decode(*problem.args(), seq_lens=problem.seq_lens)
        assert torch.equal(out, want)
    assert counter.frame_count == 1
