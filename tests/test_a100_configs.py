"""The portable kernels' A100 configurations, checked on a Hopper machine. Hopper runs its own configurations of them
(more pipeline stages, wider fp32 tiles), so these only run there with MLA_EXT_DISABLE_SM90=1 (read once per process,
so in a fresh one), which turns off everything that needs Hopper's shared memory as well as the sm_90a kernel."""

from __future__ import annotations

import pytest
import torch

from tests.reference import decode_reference
from tests.support.checks import assert_matches_reference, decode_all_ways
from tests.support.launch_paths import (
    FP32_TENSOR_CORE,
    HOPPER_CONFIG,
    PORTABLE,
    SM90,
    counts_from_line,
    launches_during,
    requires_hopper,
    run_fresh_process,
)
from tests.support.make_inputs import make_problem

# (what, make_problem options, kv_len_per_split): few rows (H * S_q <= 16), 17-32 rows and many rows, dense and paged,
# fixed and default splits (with seq_lens: balanced), odd lengths and an empty sequence.
CASES_16_BIT = [
    ("few_rows_balanced", dict(lens=[1000, 0, 37], num_heads=16), None),
    ("few_rows_fixed_split", dict(lens=[1000, 0, 37], num_heads=16), 64),
    ("few_rows_paged16", dict(lens=[300, 129, 1], num_heads=8, page_size=16), None),
    ("mid_rows_paged1", dict(lens=[700, 33], num_heads=32, page_size=1), None),
    ("mid_rows_odd_heads", dict(lens=[450, 2], num_heads=24), 96),
    ("many_rows_paged64", dict(lens=[517, 64, 0], num_heads=128, page_size=64), None),
    ("many_rows_causal_mtp", dict(lens=[200, 3], num_heads=16, seqlen_q=4, causal=True), 64),
]
CASES_FP32 = [
    ("few_rows", dict(lens=[300, 0, 17], num_heads=16), None),
    ("few_rows_fixed_split", dict(lens=[300, 0, 17], num_heads=16), 32),
    ("paged16_many_heads", dict(lens=[129, 64], num_heads=128, page_size=16), None),
    ("causal_odd_heads", dict(lens=[90], num_heads=3, seqlen_q=2, causal=True), 48),
]

SCRIPT = """
import torch
from tests.support.checks import assert_matches_reference, decode_all_ways
from tests.support.make_inputs import make_problem
from tests.reference import decode_reference
gen = torch.Generator().manual_seed({seed})
for what, options, split in {cases!r}:
    problem = make_problem(gen, device="cuda", dtype=torch.{dtype}, **options)
    out, lse = decode_all_ways(problem, kv_len_per_split=split)
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, torch.{dtype}, what)
print(list(torch.ops.mla._kernel_launch_counts()))
"""


@requires_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a100_configs_on_hopper(dtype, gen):
    """Every case against the float64 reference, three ways each (decode_all_ways), none through the sm_90a kernel
    or a Hopper-only configuration."""
    cases = CASES_FP32 if dtype == "float32" else CASES_16_BIT
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    script = SCRIPT.format(seed=seed, cases=cases, dtype=dtype)
    counts = counts_from_line(run_fresh_process(script, MLA_EXT_DISABLE_SM90="1")[-1])
    calls = 3 * len(cases)
    path = FP32_TENSOR_CORE if dtype == "float32" else PORTABLE
    assert counts[path] == calls and counts[SM90] == 0 and counts[HOPPER_CONFIG] == 0, counts


@requires_hopper
@pytest.mark.parametrize(
    "dtype, options",
    [
        (torch.float32, dict(lens=[300, 17], num_heads=16)),
        (torch.bfloat16, dict(lens=[300, 17], num_heads=32, page_size=16)),  # 32 rows the sm_90a kernel declines
    ],
    ids=["fp32", "bf16_mid_rows_paged16"],
)
def test_hopper_runs_its_own_configs(dtype, options, gen):
    """Without the switch, the same kinds of call run the Hopper-only configurations: the counter above sees them."""
    problem = make_problem(gen, device="cuda", dtype=dtype, **options)
    (out, lse), launched = launches_during(lambda: decode_all_ways(problem))
    assert launched[HOPPER_CONFIG] == 3 and launched[SM90] == 0, f"launches per path {launched}"
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype)
