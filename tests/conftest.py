"""Shared fixtures: the device axis, per-test seeds, strict-mode cleanup."""

from __future__ import annotations

import zlib

import pytest
import torch

import mla_ext
from tests.support.axes import DEVICES


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def gen(request):
    """A CPU generator seeded from the test id: reproducible, and different for every parametrization."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _strict_off():
    """Every test starts and ends with strict mode off, whatever it toggled."""
    mla_ext.set_strict(False)
    yield
    mla_ext.set_strict(False)
