"""scripts.context_parallel on the CPU with gloo: context-parallel shards merged with merge_states, and
head-parallel slices gathered over heads, both equal one decode of the whole cache (small sizes, a few seconds)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

# The ranks run the script as a module from the repository root, which puts the root (and so mla_ext, tests and
# benchmarks, as this process sees them) first on their path.
REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "ranks, extra",
    [
        (2, ["--batch", "1,3", "--heads", "16,8", "--seqlen", "700"]),
        (3, ["--batch", "4", "--heads", "6", "--seqlen", "2,300", "--dtype", "fp32"]),  # a rank with no key at all
        (1, ["--batch", "2", "--heads", "16", "--seqlen", "300", "--dtype", "fp16"]),
    ],
    ids=["2-ranks", "3-ranks-fp32", "1-rank-fp16"],
)
def test_context_parallel_script_on_cpu(ranks, extra):
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-backend=c10d",
        "-m", "scripts.context_parallel", "--device", "cpu", "--repeats", "2", "--warmup", "1", *extra,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # Generous: the three cases take ~30 s alone, but one ran past 120 s beside 16 other test workers.
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "PASS" in result.stdout and "FAIL" not in result.stdout, output[-4000:]
