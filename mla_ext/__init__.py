"""mla_ext: Multi-head Latent Attention (MLA) decode with split-KV, as PyTorch custom ops.

Importing this package loads the compiled operator library, which registers ``torch.ops.mla.decode``,
``decode_with_lse``, ``decode_out`` and ``merge_states`` for CPU (and CUDA when built with it).
"""

from ._loader import load_operator_library

BUILD_INFO = load_operator_library()

from .ops import decode, is_strict, merge_states, set_strict  # noqa: E402

__all__ = ["BUILD_INFO", "decode", "is_strict", "merge_states", "set_strict"]
