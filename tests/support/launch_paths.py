"""Which CUDA main kernel ran: the per-path launch counters of the private op torch.ops.mla._kernel_launch_counts()
-> [portable, sm90, fp32 tensor-core, cluster merge, item pairs, Hopper configuration], read in this process or, for
switches read once per process, in a fresh one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mla_ext
from tests.reference import decode_reference
from tests.support.checks import assert_matches_reference, decode_all_ways

# CLUSTER_MERGE counts launches (besides their PORTABLE or SM90 count) whose fixed split merged in thread-block
# clusters, without the combine kernel; ITEM_PAIRS (besides SM90) calls with seq_lens whose work items ran in clusters
# of two, a sequence of two pieces merged there; HOPPER_CONFIG (besides PORTABLE or FP32_TENSOR_CORE) launches of a
# portable kernel in a configuration that needs Hopper's shared memory.
PORTABLE, SM90, FP32_TENSOR_CORE, CLUSTER_MERGE, ITEM_PAIRS, HOPPER_CONFIG = 0, 1, 2, 3, 4, 5

REPO = Path(__file__).resolve().parents[2]  # fresh processes start here, so they import tests.support and mla_ext


def _is_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return False
    archs = (mla_ext.build_info.cuda_archs or "").split(";")
    return "9.0a" in archs or "9.0a+PTX" in archs


HOPPER = _is_hopper()
requires_hopper = pytest.mark.skipif(not HOPPER, reason="needs an sm_90 device and a build with 9.0a")


def launch_counts():
    counts = list(torch.ops.mla._kernel_launch_counts())
    assert len(counts) == 6, counts
    return counts


def launches_during(fn):
    """fn's result and the launches per path it made."""
    before = launch_counts()
    result = fn()
    torch.cuda.synchronize()
    after = launch_counts()
    return result, [a - b for a, b in zip(after, before, strict=True)]


def run_fresh_process(script, **env):
    """Runs the Python script in a new process with the extra environment, from the repository root (so it can
    import tests.support); returns its stdout lines. The script ends by printing
    list(torch.ops.mla._kernel_launch_counts()); parse it with counts_from_line."""
    result = subprocess.run(
        [sys.executable, "-c", script], env=dict(os.environ, **env), capture_output=True, text=True, timeout=300,
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()


def counts_from_line(line):
    return [int(c) for c in line.strip("[]").split(",")]


def check_on_path(problem, kv_len_per_split, path, what, merged=None, pairs=None):
    """Decodes the problem the three ways of checks.decode_all_ways; each time the main kernel `path` (PORTABLE or
    SM90) runs and the other never, with `merged` set the fixed split merges in clusters each time (True) or never
    (False), and with `pairs` set the work items run in clusters of two each time (True) or never (False). Then checks
    the float64 reference. Returns (out, lse)."""
    (out, lse), launched = launches_during(lambda: decode_all_ways(problem, kv_len_per_split=kv_len_per_split))
    calls = 3
    other = PORTABLE if path == SM90 else SM90
    assert launched[path] == calls and launched[other] == 0, f"{what}: launches per path {launched}"
    if merged is not None:
        assert launched[CLUSTER_MERGE] == (calls if merged else 0), f"{what}: launches per path {launched}"
    if pairs is not None:
        assert launched[ITEM_PAIRS] == (calls if pairs else 0), f"{what}: launches per path {launched}"
    ref_out, ref_lse = decode_reference(*problem.args(), **problem.reference_kwargs())
    assert_matches_reference(out, lse, ref_out, ref_lse, problem.q.dtype, what)
    return out, lse
