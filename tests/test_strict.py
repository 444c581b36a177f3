"""Strict mode: seq_lens and block_table values checked on the host before anything runs. The error names the
tensor, the first bad index and its value; nothing is written on error; boundary values pass; strided index
tensors are read by logical index; CUDA graph capture refuses strict mode with an error that says what to do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import mla_ext
from tests.support.axes import requires_cuda
from tests.support.make_inputs import empty_outputs_like, make_problem

INT32_MAX = 2**31 - 1


def paged_problem(gen, device, page_size=16):
    """Four sequences of 40, 20, 33 and 48 keys in pages of page_size; every block-table slot holds a real page."""
    problem = make_problem(
        gen,
        device=device,
        dtype=torch.bfloat16,
        lens=[40, 20, 33, 48],
        num_heads=4,
        page_size=page_size,
        spare_slots=0,
    )
    problem.block_table.clamp_(0, problem.kv.shape[0] - 1)
    return problem


def strict_error(problem, op="decode"):
    """Runs one op in strict mode and returns its ValueError message."""
    mla_ext.set_strict(True)
    try:
        with pytest.raises(ValueError) as info:
            if op == "decode":
                mla_ext.decode(*problem.args(), **problem.kwargs())
            elif op == "decode_with_lse":
                torch.ops.mla.decode_with_lse(*problem.args(), **problem.kwargs())
            else:
                out, lse = empty_outputs_like(problem.q)
                torch.ops.mla.decode_out(*problem.args(), **problem.kwargs(), out=out, lse=lse)
    finally:
        mla_ext.set_strict(False)
    return str(info.value)


@pytest.mark.parametrize("op", ["decode", "decode_with_lse", "decode_out"])
@pytest.mark.parametrize(
    "entry, value",
    [((2,), -5), ((1,), 49), ((3,), INT32_MAX), ((0,), -(2**31))],
    ids=["negative", "capacity+1", "int32-max", "int32-min"],
)
def test_seq_lens_error_names_index_and_value(entry, value, op, device, gen):
    problem = paged_problem(gen, device)
    capacity = problem.block_table.shape[1] * 16
    assert capacity == 48
    problem.seq_lens[entry] = value
    message = strict_error(problem, op)
    assert f"seq_lens[{entry[0]}] = {value}" in message, message
    assert "[0, 48]" in message, message


@pytest.mark.parametrize("op", ["decode", "decode_with_lse", "decode_out"])
@pytest.mark.parametrize("value", [-1, "P", INT32_MAX, -(2**31)], ids=["minus1", "P", "int32-max", "int32-min"])
def test_block_table_error_names_index_and_value(value, op, device, gen):
    """Entry [2, 1] is bad, and so is [3, 2] after it: the message names the first, with its value."""
    problem = paged_problem(gen, device)
    num_pages = problem.kv.shape[0]
    value = num_pages if value == "P" else value
    problem.block_table[2, 1] = value
    problem.block_table[3, 2] = -7
    message = strict_error(problem, op)
    assert f"block_table[2, 1] = {value}" in message, message
    assert f"[0, {num_pages})" in message, message


def test_first_bad_entry_is_the_first_in_batch_order(device, gen):
    """seq_lens is checked before block_table, and each in index order."""
    problem = paged_problem(gen, device)
    problem.seq_lens[3] = -1
    problem.block_table[0, 0] = -1
    assert "seq_lens[3] = -1" in strict_error(problem)


def test_error_writes_nothing(device, gen):
    """The check runs before any kernel: decode_out leaves out/lse as they were."""
    problem = paged_problem(gen, device)
    problem.seq_lens[1] = -3
    out, lse = empty_outputs_like(problem.q, poison=7.0)
    mla_ext.set_strict(True)
    with pytest.raises(ValueError, match=re.escape("seq_lens[1] = -3")):
        torch.ops.mla.decode_out(*problem.args(), **problem.kwargs(), out=out, lse=lse)
    assert (out == 7).all() and (lse == 7).all()


@pytest.mark.parametrize("page_size", [None, 1, 16], ids=["dense", "page1", "page16"])
def test_boundary_values_pass(page_size, device, gen):
    """Length 0, length == capacity, and garbage table entries past a sequence's used pages are valid."""
    problem = make_problem(
        gen,
        device=device,
        dtype=torch.float32,
        lens=[0, 48, 17, 1],
        num_heads=4,
        page_size=page_size,
        dense_seq_lens=True,
        spare_slots=1,
    )
    if page_size:
        problem.block_table[0, :] = INT32_MAX  # no key: no page used
        problem.block_table[2, -1] = -1  # 17 keys use ceil(17 / page_size) pages; the rest may be anything
        # Sequence 1 at full capacity uses every slot; its last one points at its own first (full, finite) page.
        problem.block_table[1, -1] = problem.block_table[1, 0]
        problem.seq_lens[1] = problem.block_table.shape[1] * page_size
    expected = mla_ext.decode(*problem.args(), **problem.kwargs())
    mla_ext.set_strict(True)
    assert torch.equal(mla_ext.decode(*problem.args(), **problem.kwargs()), expected)


def test_strided_index_tensors_are_read_by_logical_index(device, gen):
    """seq_lens and block_table as views with a batch stride of 2: the error names the view's index, not memory's."""
    problem = paged_problem(gen, device)
    lens_buffer = torch.full((8,), -99, dtype=torch.int32, device=device)  # odd slots hold garbage
    lens_buffer[::2] = problem.seq_lens
    table_buffer = torch.full((8, problem.block_table.shape[1]), -99, dtype=torch.int32, device=device)
    table_buffer[::2] = problem.block_table
    problem.seq_lens, problem.block_table = lens_buffer[::2], table_buffer[::2]
    expected = mla_ext.decode(*problem.args(), **problem.kwargs())
    mla_ext.set_strict(True)
    assert torch.equal(mla_ext.decode(*problem.args(), **problem.kwargs()), expected)
    mla_ext.set_strict(False)
    problem.seq_lens[2] = 1000
    assert "seq_lens[2] = 1000" in strict_error(problem)
    problem.seq_lens[2] = 33
    problem.block_table[3, 1] = -4
    assert "block_table[3, 1] = -4" in strict_error(problem)


def test_empty_batch_and_dense_default_pass(device, gen):
    mla_ext.set_strict(True)
    q = torch.randn(0, 4, 512, device=device)
    q_pe = torch.randn(0, 4, 64, device=device)
    kv, k_pe = torch.randn(0, 32, 512, device=device), torch.randn(0, 32, 64, device=device)
    assert mla_ext.decode(q, q_pe, kv, k_pe, seq_lens=torch.zeros(0, dtype=torch.int32, device=device)).shape[0] == 0
    problem = make_problem(gen, device=device, dtype=torch.float16, lens=[20, 20], num_heads=4)
    assert problem.seq_lens is None
    mla_ext.decode(*problem.args(), **problem.kwargs())


def test_set_strict_toggles():
    assert not mla_ext.is_strict()
    mla_ext.set_strict(True)
    assert mla_ext.is_strict()
    mla_ext.set_strict(False)
    assert not mla_ext.is_strict()


@requires_cuda
def test_graph_capture_refuses_strict_mode(gen):
    """Strict mode needs a host copy, which capture forbids: a RuntimeError that says so and how to fix it, raised
    before anything is enqueued; with strict mode off the same capture works and replays."""
    problem = paged_problem(gen, "cuda")
    out, lse = empty_outputs_like(problem.q)

    def step():
        torch.ops.mla.decode_out(*problem.args(), **problem.kwargs(kv_len_per_split=16), out=out, lse=lse)

    step()  # warm up outside the capture
    torch.cuda.synchronize()
    mla_ext.set_strict(True)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"strict mode.*capture.*set_strict\(False\)"):
        with torch.cuda.graph(graph):
            step()
    mla_ext.set_strict(False)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    expected = mla_ext.decode(*problem.args(), **problem.kwargs(kv_len_per_split=16))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


STRICT_SCRIPT = textwrap.dedent(
    """
    import torch, mla_ext
    q, q_pe = torch.randn(2, 4, 512), torch.randn(2, 4, 64)
    kv, k_pe = torch.randn(2, 32, 512), torch.randn(2, 32, 64)
    seq_lens = torch.tensor([5, -1], dtype=torch.int32)
    try:
        out = mla_ext.decode(q, q_pe, kv, k_pe, seq_lens=seq_lens)
    except ValueError as error:
        print("raised", "seq_lens" in str(error))
    else:
        print("finite", bool(torch.isfinite(out).all()))
    """
)


@pytest.mark.parametrize("env_value, expected", [("1", "raised True"), (None, "finite True")], ids=["set", "unset"])
def test_strict_mode_from_environment(env_value, expected):
    """MLA_EXT_STRICT=1 at import turns strict mode on; without it a bad seq_lens is clamped."""
    env = {k: v for k, v in os.environ.items() if k != "MLA_EXT_STRICT"}
    if env_value is not None:
        env["MLA_EXT_STRICT"] = env_value
    result = subprocess.run(
        [sys.executable, "-c", STRICT_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(mla_ext.__file__)),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == expected
