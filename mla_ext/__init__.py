"""mla_ext: Multi-head Latent Attention (MLA) decode with split-KV, as PyTorch custom ops.

Importing this package loads the compiled operator library, which registers ``torch.ops.mla.decode``,
``decode_with_lse``, ``decode_out``, ``plan`` and ``merge_states`` for CPU (and CUDA when built with it).
``mla_ext.build_info`` says what that library was built against (torch, CUDA, archs, flags, git revision).
``HEAD_DIM`` (512) and ``ROPE_DIM`` (64) are the only head dims the kernels support.
"""

from ._loader import BuildInfo, load_operator_library

build_info: BuildInfo = load_operator_library()
__version__: str = build_info.version or "unknown"

from .ops import HEAD_DIM, ROPE_DIM, decode, is_strict, merge_states, plan, set_strict  # noqa: E402

__all__ = [
    "HEAD_DIM",
    "ROPE_DIM",
    "BuildInfo",
    "build_info",
    "decode",
    "is_strict",
    "merge_states",
    "plan",
    "set_strict",
]
