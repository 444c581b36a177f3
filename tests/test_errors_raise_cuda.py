"""Argument errors on CUDA tensors raise in Python, in a child process so that a crash (a library whose C++
exceptions cannot cross into torch, e.g. built with a statically linked libstdc++) fails this test instead of
killing the test run. Each message must name the argument at fault. The CPU run checks the child script itself."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.axes import DEVICES

REPO = Path(__file__).resolve().parents[1]

# (case, regex its message must contain); the child runs the cases in this order.
EXPECTED = [
    ("head-dim", r"\bq\b.*\b512\b"),
    ("seq_lens-batch", r"\bseq_lens\b"),
    ("kv-batch", r"\bkv\b"),
    ("kv_len_per_split-100", r"\bkv_len_per_split\b"),
    ("kv-storage-offset-1", r"\bkv\b"),
]

CHILD = """
import sys
import torch
import mla_ext
from tests.support.make_inputs import make_problem

def misaligned(tensor):
    # Same values, the data one element past an aligned start.
    flat = torch.empty(tensor.numel() + 16, dtype=tensor.dtype, device=tensor.device)
    view = flat[1 : 1 + tensor.numel()].view(tensor.shape)
    view.copy_(tensor)
    return view

gen = torch.Generator().manual_seed(0)
device = sys.argv[1]
p = make_problem(gen, device=device, dtype=torch.bfloat16, lens=[40, 7], num_heads=4)
ok = dict(q=p.q, q_pe=p.q_pe, kv=p.kv, k_pe=p.k_pe, seq_lens=p.seq_lens)
cases = {
    "head-dim": dict(ok, q=p.q[..., : mla_ext.HEAD_DIM // 2].contiguous()),
    "seq_lens-batch": dict(ok, seq_lens=torch.cat([p.seq_lens, p.seq_lens[:1]])),
    "kv-batch": dict(ok, kv=p.kv[:1], k_pe=p.k_pe[:1]),
    "kv_len_per_split-100": dict(ok, kv_len_per_split=100),
    "kv-storage-offset-1": dict(ok, kv=misaligned(p.kv)),
}
for case, kwargs in cases.items():
    args = [kwargs.pop(name) for name in ("q", "q_pe", "kv", "k_pe")]
    try:
        mla_ext.decode(*args, **kwargs)
        print(case, "NO ERROR", sep="\\t")
    except (RuntimeError, ValueError) as error:
        print(case, type(error).__name__, str(error).splitlines()[0], sep="\\t")
mla_ext.decode(p.q, p.q_pe, p.kv, p.k_pe, seq_lens=p.seq_lens).sum().item()  # still works after the errors
print("valid call ran")
"""


@pytest.mark.parametrize("device", DEVICES)
def test_argument_errors_raise_and_name_the_argument(device):
    result = subprocess.run(
        [sys.executable, "-c", CHILD, device], cwd=REPO, capture_output=True, text=True, timeout=300
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"child exited with {result.returncode} (a negative code is a signal):\n{output}"
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "valid call ran", output
    reported = dict(line.split("\t", 1) for line in lines[:-1])
    assert list(reported) == [case for case, _ in EXPECTED], output
    for case, pattern in EXPECTED:
        kind, _, message = reported[case].partition("\t")
        assert kind in ("RuntimeError", "ValueError"), f"{case}: {reported[case]}"
        assert re.search(pattern, message), f"{case}: message {message!r} does not match {pattern!r}"
