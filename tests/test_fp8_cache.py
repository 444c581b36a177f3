"""float8_e4m3fn caches with kv_scale, in the two layouts engines store (vLLM's per-tensor 576-byte token, FlashMLA's
656-byte token with per-128 scales): results against the float64 reference of the dequantised cache, within the
query dtype's tolerance; every page size, varlen, S_q/causal, head counts; errors; opcheck, compile and CUDA graphs.
On CUDA the few- and mid-row fp8 kernel runs every row count (blocks of 32 rows over 16 rows per sequence); on Hopper
the sm_90a kernel takes per-tensor caches over 16 rows per sequence where its layout rules allow (pages of 64 keys or
more)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import mla_ext
from tests.reference import decode_reference
from tests.support.axes import DEVICES, DTYPE_IDS, DTYPES_16, requires_cuda
from tests.support.checks import assert_matches_reference
from tests.support.graphs import capture
from tests.support.launch_paths import PORTABLE, SM90, launches_during, requires_hopper
from tests.support.make_inputs import FP8, empty_outputs_like, make_problem, to_fp8_cache, varlen_lens

FORMATS = {"per-tensor": False, "per-block": True}
SHAPES = [(1, 1), (16, 1), (24, 2), (128, 1), (128, 3)]
CUDA_SHAPES = [(1, 1), (8, 1), (16, 1), (16, 2), (24, 1), (32, 1), (16, 3), (128, 1), (128, 2)]
CASES = [pytest.param("cpu", h, s, id=f"cpu-H{h}-Sq{s}") for h, s in SHAPES] + [
    pytest.param("cuda", h, s, marks=requires_cuda, id=f"cuda-H{h}-Sq{s}") for h, s in CUDA_SHAPES
]


def fp8_problem(gen, per_block, dtype=torch.bfloat16, device="cpu", **shape):
    return to_fp8_cache(gen, make_problem(gen, device=device, dtype=dtype, **shape), per_block)


@pytest.mark.parametrize("page_size", [None, 1, 16, 64, 128], ids=["dense", "page1", "page16", "page64", "page128"])
@pytest.mark.parametrize("device, num_heads, seqlen_q", CASES)
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fp8_cache_matches_reference(fmt, dtype, device, num_heads, seqlen_q, page_size, gen):
    problem = fp8_problem(
        gen, FORMATS[fmt], dtype, device=device, lens=varlen_lens(gen, 4, 211), num_heads=num_heads,
        seqlen_q=seqlen_q, causal=seqlen_q > 1, page_size=page_size, dense_seq_lens=True,
    )  # fmt: skip
    assert problem.kv.dtype == FP8
    out, lse = empty_outputs_like(problem.q)
    mla_ext.decode(*problem.args(), **problem.kwargs(), out=out, lse=lse)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"{fmt} page {page_size}")
    split = mla_ext.decode(*problem.args(), **problem.kwargs(kv_len_per_split=32), return_lse=True)
    assert_matches_reference(*split, ref_out, ref_lse, dtype, "split 32")


# (dtype, query factor): bf16 queries past fp16's range, and queries near fp16's subnormals.
FAR_QUERIES = [(torch.bfloat16, 2.0**14), (torch.bfloat16, 2.0**-12), (torch.float16, 2.0**-12)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("num_heads", [16, 32, 128])
@pytest.mark.parametrize("dtype, q_factor", FAR_QUERIES, ids=["bf16-q2^14", "bf16-q2^-12", "fp16-q2^-12"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fp8_cache_far_scales(fmt, dtype, q_factor, num_heads, page_size, device, gen):
    """Queries far from 1 (sm_scale compensating) and, per block, scales 2^-10 to 2^4 apart from key to key: the
    few-row kernel's fp16 mmas take them through powers of two, the sm_90a kernel (128 heads, pages of 64) in q's
    dtype."""
    problem = fp8_problem(gen, FORMATS[fmt], dtype, device=device, lens=varlen_lens(gen, 3, 300),
                          num_heads=num_heads, page_size=page_size)  # fmt: skip
    problem.q.mul_(q_factor)
    problem.q_pe.mul_(q_factor)
    if FORMATS[fmt]:
        exponents = torch.randint(-10, 5, problem.kv_scale.shape, generator=gen, dtype=torch.float32)
        problem.kv_scale.mul_(torch.exp2(exponents).to(device))
    sm_scale = (mla_ext.HEAD_DIM + mla_ext.ROPE_DIM) ** -0.5 / q_factor
    out, lse = mla_ext.decode(*problem.args(), **problem.kwargs(sm_scale=sm_scale), return_lse=True)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs(sm_scale=sm_scale))
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"{fmt} q x {q_factor:g}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fp8_plan_is_empty_and_accepted(fmt, device, gen):
    # CPU plans nothing for fp8 caches; CUDA's few-row kernels plan their ranges in their own CTAs
    problem = fp8_problem(gen, FORMATS[fmt], device=device, lens=[50, 3], num_heads=128 if device == "cpu" else 16,
                          page_size=16)  # fmt: skip
    plan = mla_ext.plan(*problem.args(), **problem.kwargs())
    assert plan.numel() == 0 and plan.dtype == torch.int32
    got = mla_ext.decode(*problem.args(), **problem.kwargs(plan=plan))
    assert torch.equal(got, mla_ext.decode(*problem.args(), **problem.kwargs()))
    with pytest.raises(RuntimeError, match="plan holds"):
        mla_ext.decode(*problem.args(), **problem.kwargs(plan=torch.zeros(4, dtype=torch.int32, device=device)))


def test_fp8_cache_in_strict_mode(gen):
    problem = fp8_problem(gen, False, lens=[50, 0, 17], num_heads=16, page_size=16)
    mla_ext.set_strict(True)
    out, lse = mla_ext.decode(*problem.args(), **problem.kwargs(), return_lse=True)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16, "strict")
    problem.block_table[0, 0] = problem.kv.shape[0]
    with pytest.raises(ValueError, match="block_table"):
        mla_ext.decode(*problem.args(), **problem.kwargs())


def test_fp8_cache_argument_errors(gen):
    tensor_fmt = fp8_problem(gen, False, lens=[20, 5], num_heads=8, page_size=16)
    block_fmt = fp8_problem(gen, True, lens=[20, 5], num_heads=8, page_size=16)
    q, q_pe, kv, k_pe = tensor_fmt.args()
    kw = tensor_fmt.kwargs(kv_scale=None)
    with pytest.raises(RuntimeError, match="needs kv_scale"):
        mla_ext.decode(q, q_pe, kv, k_pe, **kw)
    with pytest.raises(RuntimeError, match="float16 or bfloat16 queries"):
        mla_ext.decode(q.float(), q_pe.float(), kv, k_pe, **tensor_fmt.kwargs())
    with pytest.raises(RuntimeError, match="kv_scale must be float32"):
        mla_ext.decode(q, q_pe, kv, k_pe, **tensor_fmt.kwargs(kv_scale=tensor_fmt.kv_scale.double()))
    with pytest.raises(RuntimeError, match="k_pe must be float8_e4m3fn"):
        mla_ext.decode(q, q_pe, kv, block_fmt.k_pe, **tensor_fmt.kwargs())
    with pytest.raises(RuntimeError, match="unscaled in the dtype of q"):
        mla_ext.decode(q, q_pe, kv, k_pe, **tensor_fmt.kwargs(kv_scale=block_fmt.kv_scale))
    with pytest.raises(RuntimeError, match=r"kv_scale must be \[\] or \[1\]"):
        mla_ext.decode(*block_fmt.args(), **block_fmt.kwargs(kv_scale=block_fmt.kv_scale[..., :2]))
    with pytest.raises(RuntimeError, match="kv_scale scales a float8_e4m3fn cache"):
        mla_ext.decode(q, q_pe, kv.to(q.dtype), k_pe.to(q.dtype), **tensor_fmt.kwargs())
    with pytest.raises(RuntimeError, match="kv must have the dtype of q"):
        mla_ext.decode(q, q_pe, kv.to(torch.float8_e5m2), k_pe, **kw)


@requires_hopper
@pytest.mark.parametrize("num_heads, seqlen_q", [(128, 1), (64, 2), (32, 1), (16, 3)])
@pytest.mark.parametrize("page_size", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_fp8_cache_on_hopper_kernel(dtype, page_size, num_heads, seqlen_q, gen):
    """Per-tensor caches over 16 rows per sequence run the sm_90a kernel on Hopper, per call and with a step's plan,
    on ragged lengths (partial last tiles, NaN past them) from 0 to several splits' worth of keys."""
    lens = [4100, 0, 1, 63, 64, 65, 700, 2049]
    problem = fp8_problem(gen, False, dtype, device="cuda", lens=lens, num_heads=num_heads, seqlen_q=seqlen_q,
                          causal=seqlen_q > 1, page_size=page_size)  # fmt: skip
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    out, lse = empty_outputs_like(problem.q)
    _, launches = launches_during(
        lambda: mla_ext.decode(*problem.args(), **problem.kwargs(), out=out, lse=lse)
    )  # fmt: skip
    assert launches[SM90] == 1 and launches[PORTABLE] == 0, launches
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"page {page_size}")
    plan = mla_ext.plan(*problem.args(), **problem.kwargs())
    out.fill_(float("nan"))
    mla_ext.decode(*problem.args(), **problem.kwargs(plan=plan), out=out, lse=lse)
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"page {page_size}, planned")
    fixed = mla_ext.decode(*problem.args(), **problem.kwargs(kv_len_per_split=1024), return_lse=True)
    assert_matches_reference(*fixed, ref_out, ref_lse, dtype, "split 1024")


@requires_cuda
@pytest.mark.parametrize("num_heads, page_size", [(16, 16), (128, 64)])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fp8_cache_in_cuda_graph(fmt, num_heads, page_size, gen):
    """A captured call follows new seq_lens and new cache values on replay."""
    problem = fp8_problem(gen, FORMATS[fmt], device="cuda", lens=[300, 17, 0, 150], num_heads=num_heads,
                          page_size=page_size)  # fmt: skip
    out, lse = empty_outputs_like(problem.q)
    graph, _, _ = capture(lambda: mla_ext.decode(*problem.args(), **problem.kwargs(), out=out, lse=lse))
    for lens in ([300, 17, 0, 150], [150, 1, 0, 149]):  # shorter only: the slots past the first lengths are NaN
        problem.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        problem.kv.view(torch.uint8)[..., :7].bitwise_xor_(0x80)  # flipped signs: finite values stay finite
        out.fill_(float("nan"))
        graph.replay()
        ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
        assert_matches_reference(out, lse, ref_out, ref_lse, torch.bfloat16, f"{fmt} lens {lens}")


# opcheck's test_schema compares inputs with arithmetic that torch does not implement for float8 tensors; the
# test below checks what it would (no input but out/lse is written) byte for byte instead.
OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("op", ["decode", "decode_with_lse", "decode_out", "plan"])
def test_opcheck_fp8_cache(op, fmt, device, gen):
    problem = fp8_problem(gen, FORMATS[fmt], torch.float16, device=device, lens=[40, 1, 17], num_heads=16, seqlen_q=2,
                          causal=True, page_size=16)  # fmt: skip
    kwargs = problem.kwargs()
    if op == "decode_out":
        kwargs["out"], kwargs["lse"] = empty_outputs_like(problem.q)
    torch.library.opcheck(getattr(torch.ops.mla, op).default, problem.args(), kwargs, test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fp8_call_writes_no_input(fmt, device, gen):
    problem = fp8_problem(gen, FORMATS[fmt], device=device, lens=[40, 1, 17], num_heads=16, page_size=16)
    inputs = [*problem.args(), problem.kv_scale, problem.block_table, problem.seq_lens]
    before = [t.view(torch.uint8).clone() if t.dtype == FP8 else t.clone() for t in inputs]
    mla_ext.decode(*problem.args(), **problem.kwargs())
    mla_ext.plan(*problem.args(), **problem.kwargs())
    after = [t.view(torch.uint8) if t.dtype == FP8 else t for t in inputs]
    for a, b in zip(after, before, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_compile_fp8_cache(gen):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def step(q, q_pe, kv, k_pe, kv_scale, block_table, seq_lens):
        return mla_ext.decode(q, q_pe, kv, k_pe, kv_scale=kv_scale, block_table=block_table, seq_lens=seq_lens) * 2

    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    for lens in ([60, 7], [100, 0, 33, 9]):
        p = fp8_problem(gen, True, lens=lens, num_heads=16, page_size=16)
        args = (*p.args(), p.kv_scale, p.block_table, p.seq_lens)
        assert torch.equal(compiled(*args), step(*args)), f"lens {lens}"
    assert counter.frame_count == 1
