"""Comparisons against the float64 reference, with the tolerances of the contract."""

from __future__ import annotations

import torch

import mla_ext
from tests.support.make_inputs import empty_outputs_like

# Relative Frobenius error of out, per sequence: ||out - ref|| / ||ref||.
OUT_RTOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}
# Absolute error of lse (natural log, always fp32, but 16-bit inputs see 16-bit-rounded probabilities).
LSE_ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-3}


def relative_error(actual, expected):
    """||actual - expected|| / ||expected|| in float64 (0 when both are exactly 0)."""
    actual, expected = actual.double().cpu(), expected.double().cpu()
    diff = torch.linalg.vector_norm(actual - expected).item()
    norm = torch.linalg.vector_norm(expected).item()
    if norm == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / norm


def assert_matches_reference(out, lse, ref_out, ref_lse, dtype, what="", tolerance_scale=1.0):
    """out/lse from the op against the float64 reference, sequence by sequence.

    Rows that see no key must be exactly out 0 / lse -inf; every other value must be finite and within tolerance.
    `lse` may be None (ops that return only out), and so may `ref_lse` then. `tolerance_scale` widens both
    tolerances, e.g. 2 when the "reference" is another rounded result (CUDA against the CPU kernel).
    """
    out_rtol, lse_atol = OUT_RTOL[dtype] * tolerance_scale, LSE_ATOL[dtype] * tolerance_scale
    prefix = f"{what}: " if what else ""
    assert out.dtype == dtype, f"{prefix}out dtype {out.dtype}, expected {dtype}"
    assert tuple(out.shape) == tuple(ref_out.shape), f"{prefix}out shape {tuple(out.shape)} != {tuple(ref_out.shape)}"
    out = out.detach().cpu().double()
    assert torch.isfinite(out).all(), f"{prefix}non-finite out at {torch.nonzero(~torch.isfinite(out))[:5].tolist()}"
    # Rows with no visible key (known from ref_lse; without it, from the reference's exact zeros).
    empty = torch.isneginf(ref_lse) if ref_lse is not None else (ref_out == 0).all(-1)
    assert (out[empty] == 0).all(), f"{prefix}rows with no visible key must be exactly 0"
    for b in range(out.shape[0]):
        err = relative_error(out[b], ref_out[b])
        assert err <= out_rtol, f"{prefix}sequence {b}: relative error {err:.3g} > {out_rtol:g}"
    if lse is None:
        return
    assert lse.dtype == torch.float32, f"{prefix}lse dtype {lse.dtype}, expected float32"
    assert tuple(lse.shape) == tuple(ref_lse.shape), f"{prefix}lse shape {tuple(lse.shape)} != {tuple(ref_lse.shape)}"
    lse = lse.detach().cpu().double()
    assert torch.isneginf(lse[empty]).all(), f"{prefix}lse must be -inf exactly where no key is visible"
    finite = ~empty
    assert torch.isfinite(lse[finite]).all(), f"{prefix}lse must be finite where some key is visible"
    if finite.any():
        err = (lse[finite] - ref_lse[finite]).abs().max().item()
        assert err <= lse_atol, f"{prefix}lse max abs error {err:.3g} > {lse_atol:g}"


def decode_all_ways(problem, **options):
    """Runs one problem through mla_ext.decode(return_lse=True), torch.ops.mla.decode and torch.ops.mla.decode_out
    (into NaN-poisoned out/lse, so an element the kernel skips stays NaN). The three must agree bit for bit.
    Returns (out, lse)."""
    kwargs = problem.kwargs(**options)
    out, lse = mla_ext.decode(*problem.args(), return_lse=True, **kwargs)
    out_only = torch.ops.mla.decode(*problem.args(), **kwargs)
    out_into, lse_into = empty_outputs_like(problem.q)
    torch.ops.mla.decode_out(*problem.args(), **kwargs, out=out_into, lse=lse_into)
    assert torch.equal(out_only, out), "torch.ops.mla.decode differs from mla_ext.decode(return_lse=True)"
    assert torch.equal(out_into, out), "decode_out left or wrote elements differently (out was NaN-poisoned)"
    assert torch.equal(lse_into, lse), "decode_out left or wrote lse elements differently (lse was NaN-poisoned)"
    return out, lse


def assert_repeatable(problem, repeats=3, **options):
    """Decodes the problem 1 + `repeats` times with the same options; every result must be bitwise the first."""
    kwargs = problem.kwargs(**options)
    out, lse = mla_ext.decode(*problem.args(), return_lse=True, **kwargs)
    for _ in range(repeats):
        again_out, again_lse = mla_ext.decode(*problem.args(), return_lse=True, **kwargs)
        assert torch.equal(again_out, out) and torch.equal(again_lse, lse), "repeated calls differ"
    return out, lse
