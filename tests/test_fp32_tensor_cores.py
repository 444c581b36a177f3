"""Which kernel runs fp32 on CUDA: the tensor-core one (3xTF32) on devices with at least A100's shared memory, the
CUDA-core one with MLA_EXT_FP32_CUDA_CORES=1; both within the fp32 tolerance. Launches are counted per path by the
private op torch.ops.mla._kernel_launch_counts() (tests/support/launch_paths.py)."""

from __future__ import annotations

import pytest
import torch

from tests.reference import decode_reference
from tests.support.axes import requires_cuda
from tests.support.checks import assert_matches_reference, decode_all_ways
from tests.support.launch_paths import FP32_TENSOR_CORE, PORTABLE, counts_from_line, launches_during, run_fresh_process
from tests.support.make_inputs import make_problem


@requires_cuda
@pytest.mark.parametrize(
    "options",
    [
        dict(lens=[300, 0, 17], num_heads=16),
        dict(lens=[129, 64], num_heads=128, page_size=16),
        dict(lens=[90], num_heads=3, seqlen_q=2, causal=True),
    ],
    ids=["dense_h16", "paged_h128", "causal_odd_heads"],
)
@pytest.mark.parametrize("kv_len_per_split", [None, 32])
def test_fp32_runs_on_tensor_cores(options, kv_len_per_split, gen):
    problem = make_problem(gen, device="cuda", dtype=torch.float32, **options)
    (out, lse), launched = launches_during(lambda: decode_all_ways(problem, kv_len_per_split=kv_len_per_split))
    assert launched[FP32_TENSOR_CORE] == 3 and launched[PORTABLE] == 0, f"launches per path {launched}"
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.float32)


@requires_cuda
def test_env_runs_fp32_on_cuda_cores():
    """MLA_EXT_FP32_CUDA_CORES=1 (read once per process) sends fp32 calls to the CUDA-core kernel; it agrees with the
    CPU kernel to twice the fp32 tolerance (both are rounded)."""
    script = (
        "import torch, mla_ext\n"
        "g = torch.Generator(device='cuda').manual_seed(0)\n"
        "args = [torch.randn(2, 16, d, device='cuda', generator=g) for d in (512, 64)]\n"
        "args += [torch.randn(2, 300, d, device='cuda', generator=g) for d in (512, 64)]\n"
        "out = mla_ext.decode(*args, kv_len_per_split=128)\n"
        "ref = mla_ext.decode(*[a.cpu() for a in args], kv_len_per_split=128).double()\n"
        "print(((out.double().cpu() - ref).norm() / ref.norm()).item())\n"
        "print(list(torch.ops.mla._kernel_launch_counts()))\n"
    )
    *_, err, counts = run_fresh_process(script, MLA_EXT_FP32_CUDA_CORES="1")
    counts = counts_from_line(counts)
    assert counts[PORTABLE] == 1 and counts[FP32_TENSOR_CORE] == 0, counts
    assert float(err) < 2e-5, err
