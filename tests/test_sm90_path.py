"""Which CUDA kernel runs: on Hopper (compute capability 9.0) fp16/bf16 calls with more than 16 query rows per
sequence take the wgmma + TMA kernel, other fp16/bf16 calls the portable kernel (fp32: test_fp32_tensor_cores.py),
and both agree with the float64 reference. Launches are counted per path by the private op
torch.ops.mla._kernel_launch_counts() (tests/support/launch_paths.py)."""

from __future__ import annotations

import pytest

from tests.reference import decode_reference
from tests.support.axes import DTYPE_IDS, DTYPES_16
from tests.support.checks import assert_matches_reference, assert_repeatable, decode_all_ways
from tests.support.launch_paths import (
    PORTABLE,
    SM90,
    check_on_path,
    counts_from_line,
    launch_counts,
    launches_during,
    requires_hopper,
    run_fresh_process,
)
from tests.support.make_inputs import make_problem


def test_launch_counts_op_exists():
    """The counters are readable in every build (all zeros where no CUDA kernel ran)."""
    counts = launch_counts()
    assert all(isinstance(c, int) and c >= 0 for c in counts)


# (name, make_problem options, kv_len_per_split, path that must run). Caches are NaN/inf-poisoned beyond every
# sequence's length, so a masked V row that is not zeroed shows up as NaN.
SM90_CASES = [
    ("dense_one_split", dict(lens=[300, 300], num_heads=128), 1024, SM90),
    ("dense_splits_tail", dict(lens=[257, 0, 1, 130], num_heads=128, dense_slack=10), 128, SM90),
    ("dense_fused_cache", dict(lens=[200, 77], num_heads=64, cache_layout="fused"), 64, SM90),
    ("dense_odd_heads", dict(lens=[190, 64], num_heads=40), 128, SM90),
    ("paged64_one_split", dict(lens=[500, 64, 3, 0], num_heads=128, page_size=64), 4096, SM90),
    ("paged64_splits", dict(lens=[500, 64, 3, 0], num_heads=128, page_size=64), 192, SM90),
    ("paged128_causal_mtp", dict(lens=[200, 2, 77], num_heads=16, seqlen_q=4, causal=True, page_size=128), 64, SM90),
    ("dense_causal_heads128", dict(lens=[129, 70], num_heads=128, seqlen_q=2, causal=True), 64, SM90),
    ("paged64_transposed_q", dict(lens=[333, 65], num_heads=128, page_size=64, q_layout="transposed"), 256, SM90),
    ("paged64_default_split", dict(lens=[3000, 64, 3, 0, 700], num_heads=128, page_size=64), None, SM90),
    ("dense_default_split", dict(lens=[1500, 1500], num_heads=128), None, SM90),
    # One sequence: its CTAs plan their own work item (no planner kernel).
    ("paged64_default_split_one_sequence", dict(lens=[5003], num_heads=128, page_size=64), None, SM90),
    # Long tile chains: 16, 11, 2 and 2 tiles, partial last tiles of even (WG0) and odd (WG1) position.
    ("dense_pairs_one_split", dict(lens=[1000, 701, 128, 65], num_heads=128), 4096, SM90),
    ("dense_pairs_odd_splits", dict(lens=[1000, 701], num_heads=128), 192, SM90),
    # 17-32 rows: the 64-row tiles run partly empty; the planners size these calls for this kernel too.
    ("dense_heads32", dict(lens=[300, 77, 0], num_heads=32), 128, SM90),
    ("dense_heads16_mtp_causal", dict(lens=[200, 65], num_heads=16, seqlen_q=2, causal=True), 64, SM90),
    ("paged64_heads24_default_split", dict(lens=[3000, 64, 3, 0, 700], num_heads=24, page_size=64), None, SM90),
    ("dense_heads32_default_split_one_sequence", dict(lens=[5003], num_heads=32), None, SM90),
]
# Problems the sm_90a kernel leaves to the portable one.
PORTABLE_CASES = [
    ("paged16", dict(lens=[300, 40], num_heads=128, page_size=16), 64, PORTABLE),
    ("split_not_64_aligned", dict(lens=[300, 40], num_heads=128), 48, PORTABLE),
    ("few_rows", dict(lens=[300, 40], num_heads=16), 64, PORTABLE),
    ("heads32_split_not_64_aligned", dict(lens=[300, 40], num_heads=32), 48, PORTABLE),
    # Planned as work items for this kernel, walked as ranges by the portable one.
    ("paged16_heads32_default_split", dict(lens=[2100, 5, 0, 900], num_heads=32, page_size=16), None, PORTABLE),
    ("paged16_default_split", dict(lens=[2100, 5, 0], num_heads=128, page_size=16), None, PORTABLE),
    ("paged16_default_split_one_sequence", dict(lens=[2100], num_heads=128, page_size=16), None, PORTABLE),
]
PATH_CASES = SM90_CASES + PORTABLE_CASES


@requires_hopper
@pytest.mark.parametrize("name,options,split,path", PATH_CASES, ids=[c[0] for c in PATH_CASES])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_kernel_path_and_result(dtype, name, options, split, path, gen):
    """The expected kernel runs for each of the three op spellings (and the other never), and matches float64."""
    problem = make_problem(gen, device="cuda", dtype=dtype, **options)
    check_on_path(problem, split, path, name)


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_sm90_invalid_pages_are_invisible(dtype, gen):
    """block_table entries outside [0, P) inside the used pages hide their keys; the kernel never loads them."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[256, 192, 64], num_heads=128, page_size=64)
    problem.block_table[0, 1] = -1
    problem.block_table[1, 0] = 2**31 - 1
    problem.block_table[2, 0] = -5  # sequence 2 sees no key at all
    (out, lse), launched = launches_during(lambda: decode_all_ways(problem, kv_len_per_split=128))
    assert launched[SM90] == 3, f"launches per path {launched}"
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, "invalid pages")


@requires_hopper
@pytest.mark.parametrize("split", [4096, 256], ids=["one_split", "splits"])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_sm90_invalid_pages_at_both_parities(dtype, split, gen):
    """Skipped tiles at even and odd positions (the two consumer warpgroups own alternate tiles): first, middle,
    adjacent, and last tiles, full and partial."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[1000, 640, 300], num_heads=128, page_size=64)
    for b, page in [(0, 0), (0, 5), (0, 6), (0, 15), (1, 9), (2, 4)]:
        problem.block_table[b, page] = -1
    (out, lse), launched = launches_during(lambda: decode_all_ways(problem, kv_len_per_split=split))
    assert launched[SM90] == 3, f"launches per path {launched}"
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, "invalid pages at both parities")


@requires_hopper
@pytest.mark.parametrize("sm_scale", [0.1, 0.0, -0.05])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_sm90_explicit_sm_scale(dtype, sm_scale, gen):
    """The softmax of a tile every key of which all rows see takes the max of the raw scores, which needs a
    positive scale; zero and negative scales take the masked path. Whole and partial tiles, several splits."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[320, 129, 64], num_heads=128)
    (out, lse), launched = launches_during(
        lambda: decode_all_ways(problem, sm_scale=sm_scale, kv_len_per_split=128)
    )
    assert launched[SM90] == 3, f"launches per path {launched}"
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs(sm_scale=sm_scale))
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, f"sm_scale {sm_scale}")


@requires_hopper
@pytest.mark.parametrize("split", [4096, 256], ids=["one_split", "splits"])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_sm90_running_max_jumps(dtype, split, gen):
    """Keys scaled up in later tiles, even and odd (both warpgroups' tiles), raise rows' running max far beyond
    the slack that keeps an old max, so the O halves rescale mid-sequence; smaller rises keep the old max."""
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[1000, 700], num_heads=128)
    for key, factor in [(70, 4.0), (300, 12.0), (450, 30.0), (650, 60.0)]:
        problem.kv[:, key] *= factor
    (out, lse), launched = launches_during(lambda: decode_all_ways(problem, kv_len_per_split=split))
    assert launched[SM90] == 3, f"launches per path {launched}"
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, dtype, "running max jumps")


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES_16, ids=DTYPE_IDS.get)
def test_sm90_deterministic(dtype, gen):
    problem = make_problem(gen, device="cuda", dtype=dtype, lens=[1000, 517], num_heads=128, page_size=64)
    assert_repeatable(problem, kv_len_per_split=256)


@requires_hopper
def test_env_disables_sm90():
    """MLA_EXT_DISABLE_SM90=1 (read once per process) sends every call to the portable kernel."""
    script = (
        "import torch, mla_ext\n"
        "q = torch.randn(2, 128, 512, dtype=torch.bfloat16, device='cuda')\n"
        "q_pe = torch.randn(2, 128, 64, dtype=torch.bfloat16, device='cuda')\n"
        "kv = torch.randn(2, 256, 512, dtype=torch.bfloat16, device='cuda')\n"
        "k_pe = torch.randn(2, 256, 64, dtype=torch.bfloat16, device='cuda')\n"
        "mla_ext.decode(q, q_pe, kv, k_pe, kv_len_per_split=128)\n"
        "torch.cuda.synchronize()\n"
        "print(list(torch.ops.mla._kernel_launch_counts()))\n"
    )
    counts = counts_from_line(run_fresh_process(script, MLA_EXT_DISABLE_SM90="1")[-1])
    assert counts[PORTABLE] == 1 and counts[SM90] == 0, counts
