"""mla.plan: a step's schedule made once and handed to every layer's decode gives the per-call result bit for bit, in
eager mode, in a CUDA graph whose replays change seq_lens, and under torch.compile; a plan for other shapes raises."""

from __future__ import annotations

import random

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import mla_ext
from tests.reference import decode_reference
from tests.support.axes import DTYPE_IDS, DTYPES, requires_cuda
from tests.support.checks import assert_matches_reference
from tests.support.graphs import capture
from tests.support.launch_paths import HOPPER, ITEM_PAIRS
from tests.support.make_inputs import Problem, empty_outputs_like, make_problem, randn, varlen_lens

# (heads, query tokens): 16 and 32 rows walk ranges (nothing planned ahead), 48 and more take work items.
ROWS = [(16, 1), (16, 2), (24, 2), (128, 1), (128, 2)]


def new_layer(gen, problem):
    """Another layer of the same step: fresh queries and cache values, the same block table, seq_lens and poison."""

    def fresh(t):
        return torch.where(torch.isfinite(t), randn(gen, t.shape, t.dtype, t.device), t)

    return Problem(fresh(problem.q), fresh(problem.q_pe), fresh(problem.kv), fresh(problem.k_pe), problem.block_table,
                   problem.seq_lens, problem.causal)


def planner_kernels_during(fn):
    """Launches of the work-item planner kernel while fn runs (profiler), and fn's result."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if "plan_work_items" in e.key), result


@pytest.mark.parametrize("page_size", [None, 1, 16, 64], ids=["dense", "page1", "page16", "page64"])
@pytest.mark.parametrize("num_heads, seqlen_q", ROWS, ids=[f"H{h}-Sq{s}" for h, s in ROWS])
def test_plan_gives_the_per_call_result(num_heads, seqlen_q, page_size, device, gen):
    rng = random.Random(int(torch.randint(1 << 30, (1,), generator=gen)))
    batch = rng.choice([2, 5, 23, 40])
    problem = make_problem(
        gen,
        device=device,
        dtype=torch.bfloat16,
        lens=varlen_lens(gen, batch, 700),
        num_heads=num_heads,
        seqlen_q=seqlen_q,
        causal=seqlen_q > 1,
        page_size=page_size,
        dense_seq_lens=True,
    )
    plan = mla_ext.plan(*problem.args(), **problem.kwargs())
    assert plan.dtype == torch.int32 and plan.device == problem.q.device and plan.dim() == 1
    if device == "cuda" and HOPPER and num_heads * seqlen_q > 32:
        assert plan.numel() > 0, "work items are planned ahead"
    for layer in (problem, new_layer(gen, problem)):
        out, lse = empty_outputs_like(layer.q)
        mla_ext.decode(*layer.args(), **layer.kwargs(plan=plan), out=out, lse=lse, return_lse=True)
        per_call = mla_ext.decode(*layer.args(), **layer.kwargs(), return_lse=True)
        assert torch.equal(out, per_call[0]) and torch.equal(lse, per_call[1])
        ref_out, ref_lse = decode_reference(*layer.args(), **layer.reference_kwargs())
        assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16, f"B={batch}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_plan_with_every_dtype_and_a_fixed_split(dtype, device, gen):
    problem = make_problem(
        gen, device=device, dtype=dtype, lens=[300, 0, 17, 129], num_heads=128, page_size=16, dense_seq_lens=True
    )
    for split in (None, 64):
        kwargs = problem.kwargs(kv_len_per_split=split)
        plan = mla_ext.plan(*problem.args(), **kwargs)
        if split is not None:
            assert plan.numel() == 0, "a fixed split plans nothing ahead"
        out, lse = mla_ext.decode(*problem.args(), **kwargs, plan=plan, return_lse=True)
        ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
        assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"split {split}")


@requires_cuda
def test_decode_with_a_plan_runs_no_planner(gen):
    problem = make_problem(
        gen, device="cuda", dtype=torch.float16, lens=[900, 40, 513, 7, 260], num_heads=128, page_size=64
    )
    per_call, _ = planner_kernels_during(lambda: mla_ext.decode(*problem.args(), **problem.kwargs()))
    planning, plan = planner_kernels_during(lambda: mla_ext.plan(*problem.args(), **problem.kwargs()))
    with_plan, _ = planner_kernels_during(lambda: mla_ext.decode(*problem.args(), **problem.kwargs(plan=plan)))
    assert plan.numel() > 0, "several sequences at 128 heads take planned work items"
    assert (per_call, planning, with_plan) == (1, 1, 0), "planner launches: per call, plan, decode with the plan"


@requires_cuda
@pytest.mark.parametrize("num_heads", [16, 128])
def test_graph_of_a_step_follows_new_lengths(num_heads, gen):
    """plan + three layers captured once; each replay's seq_lens and block table reach every layer."""
    batch, layers = 24, 3
    first = make_problem(
        gen, device="cuda", dtype=torch.bfloat16, lens=[1024] * batch, num_heads=num_heads, page_size=64,
        spare_slots=0,
    )
    step_layers = [first] + [new_layer(gen, first) for _ in range(layers - 1)]
    outs = [empty_outputs_like(layer.q) for layer in step_layers]

    def step():
        plan = mla_ext.plan(*first.args(), **first.kwargs())
        for layer, (out, lse) in zip(step_layers, outs, strict=True):
            mla_ext.decode(*layer.args(), **layer.kwargs(plan=plan), out=out, lse=lse)

    graph, _, launched = capture(step)
    rng = random.Random(int(torch.randint(1 << 30, (1,), generator=gen)))
    table = first.block_table.clone()
    for replay, lens in enumerate(
        [[1000] * batch, [rng.randint(0, 1024) for _ in range(batch)], [0] * batch, [1024] * 12 + [1] * 12]
    ):
        first.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        first.block_table.copy_(table.roll(replay, dims=0))
        for out, lse in outs:
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for layer, (out, lse) in zip(step_layers, outs, strict=True):
            ref_out, ref_lse = decode_reference(*layer.args(), **layer.reference_kwargs())
            assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16, f"replay {replay}")
    if HOPPER and num_heads == 128:
        assert launched[ITEM_PAIRS] == layers, f"the plan pairs items for every layer: {launched}"


def test_plan_for_other_shapes_raises(device, gen):
    problem = make_problem(gen, device=device, dtype=torch.bfloat16, lens=[70, 33, 5], num_heads=128, page_size=16)
    plan = mla_ext.plan(*problem.args(), **problem.kwargs())
    stranger = torch.zeros(plan.numel() + 4, dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match="plan holds"):
        mla_ext.decode(*problem.args(), **problem.kwargs(plan=stranger))
    with pytest.raises(RuntimeError, match="plan must be int32"):
        mla_ext.decode(*problem.args(), **problem.kwargs(plan=plan.long()))
    with pytest.raises(RuntimeError, match="one contiguous dim"):
        mla_ext.decode(*problem.args(), **problem.kwargs(plan=plan.view(1, -1)))


@pytest.mark.parametrize("op", ["plan", "decode"])
def test_opcheck_plan_ops(op, device, gen):
    problem = make_problem(
        gen, device=device, dtype=torch.float16, lens=[70, 1, 33], num_heads=128, seqlen_q=2, causal=True, page_size=16
    )
    kwargs = problem.kwargs()
    if op == "decode":
        kwargs["plan"] = mla_ext.plan(*problem.args(), **kwargs)
    torch.library.opcheck(getattr(torch.ops.mla, op).default, problem.args(), kwargs)


def test_compile_a_step_with_its_plan(device, gen):
    """plan and two layers' decodes in one fullgraph compile, dynamic shapes, equal to eager bit for bit."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def step(q, q_pe, kv_a, k_pe_a, kv_b, k_pe_b, block_table, seq_lens):
        plan = mla_ext.plan(q, q_pe, kv_a, k_pe_a, block_table=block_table, seq_lens=seq_lens)
        a = mla_ext.decode(q, q_pe, kv_a, k_pe_a, block_table=block_table, seq_lens=seq_lens, plan=plan)
        b = mla_ext.decode(q * 2, q_pe, kv_b, k_pe_b, block_table=block_table, seq_lens=seq_lens, plan=plan)
        return a, b

    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    for lens in ([100, 40, 9], [257, 3, 80, 20]):
        a = make_problem(gen, device=device, dtype=torch.bfloat16, lens=lens, num_heads=128, page_size=16)
        b = new_layer(gen, a)
        args = (a.q, a.q_pe, a.kv, a.k_pe, b.kv, b.k_pe, a.block_table, a.seq_lens)
        got, want = compiled(*args), step(*args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"lens {lens}"
    assert counter.frame_count == 1
