"""The axes most tests are parametrized over: device (CUDA skipped cleanly when absent) and dtype."""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
DTYPES_16 = [torch.float16, torch.bfloat16]  # the tensor-core kernels' dtypes
DTYPE_IDS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
