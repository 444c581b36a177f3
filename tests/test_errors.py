"""Every bad input of the contract raises RuntimeError/ValueError naming the argument; backward is refused."""

from __future__ import annotations

import pytest
import torch

import mla_ext
from tests.support.axes import requires_cuda

ERRORS = (RuntimeError, ValueError)
B, H, S, PAGE, MAX_PAGES = 2, 4, 32, 16, 3


def name(arg):
    """Regex for an argument name as a whole word (so "q" does not match "q_pe")."""
    return rf"\b{arg}\b"


def misaligned(tensor):
    """Same values, but the data starts one element past a 16-byte boundary."""
    flat = torch.empty(tensor.numel() + 16, dtype=tensor.dtype, device=tensor.device)
    view = flat[1 : 1 + tensor.numel()].view(tensor.shape)
    view.copy_(tensor)
    return view


def strided_last_dim(tensor):
    """Same values, with the last dim at stride 2."""
    wide = torch.empty((*tensor.shape[:-1], 2 * tensor.shape[-1]), dtype=tensor.dtype, device=tensor.device)
    wide[..., ::2] = tensor
    return wide[..., ::2]


def misaligned_rows(tensor):
    """Same values, each row one element longer than its width (rows no longer start 16-byte aligned)."""
    wide = torch.empty((*tensor.shape[:-1], tensor.shape[-1] + 1), dtype=tensor.dtype, device=tensor.device)
    wide[..., :-1] = tensor
    return wide[..., :-1]


def good_args(paged, device="cpu", dtype=torch.float16):
    """Valid arguments (dense or paged) that each case breaks in exactly one way."""
    args = dict(
        q=torch.randn(B, H, 512, device=device).to(dtype),
        q_pe=torch.randn(B, H, 64, device=device).to(dtype),
        block_table=None,
        seq_lens=None,
    )
    if paged:
        args["kv"] = torch.randn(B * MAX_PAGES, PAGE, 512, device=device).to(dtype)
        args["k_pe"] = torch.randn(B * MAX_PAGES, PAGE, 64, device=device).to(dtype)
        args["block_table"] = torch.arange(B * MAX_PAGES, dtype=torch.int32, device=device).reshape(B, MAX_PAGES)
        args["seq_lens"] = torch.tensor([40, 7], dtype=torch.int32, device=device)
    else:
        args["kv"] = torch.randn(B, S, 512, device=device).to(dtype)
        args["k_pe"] = torch.randn(B, S, 64, device=device).to(dtype)
    return args


def with_(**changes):
    return lambda args: {**args, **{key: change(args) for key, change in changes.items()}}


# (id, paged, how to break the arguments, regex the message must contain)
BAD_INPUTS = [
    ("q-rank-2", False, with_(q=lambda a: a["q"][:, 0]), name("q")),
    ("q-rank-5", False, with_(q=lambda a: a["q"][None, None]), name("q")),
    ("q_pe-rank", False, with_(q_pe=lambda a: a["q_pe"][:, None]), name("q_pe")),
    ("kv-rank-2", False, with_(kv=lambda a: a["kv"][0]), name("kv")),
    ("k_pe-rank-4", False, with_(k_pe=lambda a: a["k_pe"][None]), name("k_pe")),
    ("q_pe-heads", False, with_(q_pe=lambda a: a["q_pe"][:, :2]), name("q_pe")),
    ("k_pe-length", False, with_(k_pe=lambda a: a["k_pe"][:, :16]), name("k_pe")),
    ("q_pe-batch", False, with_(q_pe=lambda a: a["q_pe"][:1]), name("q_pe")),
    ("kv-batch", False, with_(kv=lambda a: a["kv"][:1]), name("kv")),
    ("k_pe-batch", False, with_(k_pe=lambda a: a["k_pe"][:1]), name("k_pe")),
    ("paged-k_pe-pages", True, with_(k_pe=lambda a: a["k_pe"][:-1]), name("k_pe")),
    ("paged-k_pe-page_size", True, with_(k_pe=lambda a: a["k_pe"][:, :8]), name("k_pe")),
    ("q-float64", False, with_(q=lambda a: a["q"].double()), name("q")),
    ("all-float64", False, lambda a: {**a, **{k: a[k].double() for k in ("q", "q_pe", "kv", "k_pe")}}, name("q")),
    ("q_pe-dtype", False, with_(q_pe=lambda a: a["q_pe"].bfloat16()), name("q_pe")),
    ("kv-dtype", False, with_(kv=lambda a: a["kv"].float()), name("kv")),
    ("k_pe-dtype", False, with_(k_pe=lambda a: a["k_pe"].bfloat16()), name("k_pe")),
    ("q-last-dim-stride", False, with_(q=lambda a: strided_last_dim(a["q"])), name("q")),
    ("q_pe-last-dim-stride", False, with_(q_pe=lambda a: strided_last_dim(a["q_pe"])), name("q_pe")),
    ("kv-last-dim-stride", False, with_(kv=lambda a: strided_last_dim(a["kv"])), name("kv")),
    ("k_pe-last-dim-stride", True, with_(k_pe=lambda a: strided_last_dim(a["k_pe"])), name("k_pe")),
    ("q-misaligned", False, with_(q=lambda a: misaligned(a["q"])), name("q")),
    ("q_pe-misaligned", False, with_(q_pe=lambda a: misaligned(a["q_pe"])), name("q_pe")),
    ("kv-misaligned", True, with_(kv=lambda a: misaligned(a["kv"])), name("kv")),
    ("k_pe-misaligned", False, with_(k_pe=lambda a: misaligned(a["k_pe"])), name("k_pe")),
    ("kv-rows-misaligned", False, with_(kv=lambda a: misaligned_rows(a["kv"])), name("kv")),
    ("k_pe-rows-misaligned", True, with_(k_pe=lambda a: misaligned_rows(a["k_pe"])), name("k_pe")),
    (
        "head-dim-128",
        False,
        with_(q=lambda a: a["q"][..., :128].contiguous(), kv=lambda a: a["kv"][..., :128].contiguous()),
        "512",  # the message lists the supported sizes
    ),
    (
        "rope-dim-16",
        False,
        with_(q_pe=lambda a: a["q_pe"][..., :16].contiguous(), k_pe=lambda a: a["k_pe"][..., :16].contiguous()),
        r"\b64\b",
    ),
    ("kv-head-dim-differs", False, with_(kv=lambda a: a["kv"][..., :256].contiguous()), name("kv")),
    ("k_pe-rope-dim-differs", True, with_(k_pe=lambda a: a["k_pe"][..., :32].contiguous()), name("k_pe")),
    ("block_table-without-seq_lens", True, with_(seq_lens=lambda a: None), name("seq_lens")),
    ("block_table-int64", True, with_(block_table=lambda a: a["block_table"].long()), name("block_table")),
    ("seq_lens-int64", True, with_(seq_lens=lambda a: a["seq_lens"].long()), name("seq_lens")),
    ("dense-seq_lens-int64", False, with_(seq_lens=lambda a: torch.tensor([3, 4])), name("seq_lens")),
    ("seq_lens-float", True, with_(seq_lens=lambda a: a["seq_lens"].float()), name("seq_lens")),
    ("block_table-rank-1", True, with_(block_table=lambda a: a["block_table"][0]), name("block_table")),
    ("block_table-batch", True, with_(block_table=lambda a: a["block_table"][:1]), name("block_table")),
    (
        "block_table-last-dim-stride",
        True,
        with_(block_table=lambda a: a["block_table"].t().contiguous().t()),
        name("block_table"),
    ),
    ("seq_lens-batch", True, with_(seq_lens=lambda a: a["seq_lens"][:1]), name("seq_lens")),
    ("seq_lens-rank-2", True, with_(seq_lens=lambda a: a["seq_lens"][:, None]), name("seq_lens")),
]


def call(entry, args, **options):
    fn = torch.ops.mla.decode if entry == "op" else mla_ext.decode
    return fn(
        args["q"],
        args["q_pe"],
        args["kv"],
        args["k_pe"],
        block_table=args["block_table"],
        seq_lens=args["seq_lens"],
        **options,
    )


@pytest.mark.parametrize("entry", ["op", "wrapper"])
@pytest.mark.parametrize(
    "paged, breaks, message", [case[1:] for case in BAD_INPUTS], ids=[case[0] for case in BAD_INPUTS]
)
def test_bad_input_names_the_argument(entry, paged, breaks, message):
    args = good_args(paged)
    call(entry, args)  # the unbroken arguments are accepted
    with pytest.raises(ERRORS, match=message):
        call(entry, breaks(args))


@pytest.mark.parametrize("entry", ["op", "wrapper"])
@pytest.mark.parametrize("kv_len_per_split", [0, -16, 8, 100, 130])
def test_kv_len_per_split_must_be_positive_multiple_of_16(entry, kv_len_per_split):
    with pytest.raises(ERRORS, match=name("kv_len_per_split")):
        call(entry, good_args(paged=False), kv_len_per_split=kv_len_per_split)


def bad_outputs(q, broken):
    """(out, lse) for q with one of them broken."""
    out = torch.empty(*q.shape[:-1], 512, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    return {
        "out-shape-D": (out[..., :256], lse),
        "out-shape-H": (torch.empty(B, H + 1, 512, dtype=q.dtype), lse),
        "out-dtype": (out.float(), lse),
        "out-last-dim-stride": (strided_last_dim(out), lse),
        "out-rank": (out[0], lse),
        "lse-dtype": (out, lse.half()),
        "lse-shape": (out, torch.empty(B, H + 1)),
        "lse-rank": (out, lse[..., None]),
    }[broken]


@pytest.mark.parametrize("entry", ["op", "wrapper"])
@pytest.mark.parametrize(
    "broken",
    [
        "out-shape-D",
        "out-shape-H",
        "out-dtype",
        "out-last-dim-stride",
        "out-rank",
        "lse-dtype",
        "lse-shape",
        "lse-rank",
    ],
)
def test_bad_outputs_name_the_argument(entry, broken):
    args = good_args(paged=True)
    out, lse = bad_outputs(args["q"], broken)
    with pytest.raises(ERRORS, match=name(broken.split("-")[0])):
        if entry == "op":
            torch.ops.mla.decode_out(
                args["q"],
                args["q_pe"],
                args["kv"],
                args["k_pe"],
                block_table=args["block_table"],
                seq_lens=args["seq_lens"],
                out=out,
                lse=lse,
            )
        else:
            call(entry, args, out=out, lse=lse, return_lse=True)


@requires_cuda
@pytest.mark.parametrize("entry", ["op", "wrapper"])
@pytest.mark.parametrize("moved", ["q_pe", "kv", "k_pe", "block_table", "seq_lens"])
def test_tensors_on_two_devices(entry, moved):
    args = good_args(paged=True, device="cuda")
    args[moved] = args[moved].cpu()
    with pytest.raises(ERRORS, match=name(moved)):
        call(entry, args)


@requires_cuda
@pytest.mark.parametrize("moved", ["out", "lse"])
def test_outputs_on_another_device(moved):
    args = good_args(paged=False, device="cuda")
    outputs = {
        "out": torch.empty(B, H, 512, dtype=torch.float16, device="cuda"),
        "lse": torch.empty(B, H, device="cuda"),
    }
    outputs[moved] = outputs[moved].cpu()
    with pytest.raises(ERRORS, match=name(moved)):
        torch.ops.mla.decode_out(args["q"], args["q_pe"], args["kv"], args["k_pe"], **outputs)


BACKWARD_MESSAGE = r"(?i)backward|backprop|differentiable|inference"


@pytest.mark.parametrize("entry", ["op", "wrapper"])
def test_backward_is_refused(entry, device):
    """Inference only: backprop through the op raises a clear error (at the call or at .backward())."""
    args = good_args(paged=False, device=device, dtype=torch.float32)
    args["q"].requires_grad_(True)
    with pytest.raises(ERRORS, match=BACKWARD_MESSAGE):
        call(entry, args).sum().backward()


def test_inference_with_grad_requiring_inputs(device):
    """Under no_grad the op runs even when an input requires grad (weights-derived queries in a served model)."""
    args = good_args(paged=False, device=device, dtype=torch.float32)
    expected = call("op", args)
    args["q"].requires_grad_(True)
    with torch.no_grad():
        got = call("wrapper", args)
    assert torch.equal(got, expected)
