"""Build metadata, and the errors for a library built for another torch or for other GPU architectures.

No second torch and no GPU needed: the torch check runs on made-up versions and package folders, and the
architecture check (the one the CUDA glue runs before its first launch) on made-up compute capabilities.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mla_ext
from mla_ext import _loader
from tests.support.axes import requires_cuda

REBUILD = "pip install --no-build-isolation"


def write_package(folder: Path, built_for_torch: str) -> Path:
    """A package folder holding a library that is not one and a build record for `built_for_torch`."""
    (folder / "_C.abi3.so").write_bytes(b"not a shared library")
    (folder / "_build_info.py").write_text(f"BUILD_INFO = {{'torch': {built_for_torch!r}, 'cuda_archs': None}}\n")
    return folder


def test_build_info_describes_this_build():
    info = mla_ext.build_info
    assert info.torch == torch.__version__
    assert info.version == mla_ext.__version__
    assert info.with_cuda == (info.cuda_archs is not None)
    if info.with_cuda:
        for entry in info.cuda_archs.split(";"):
            arch = entry.removesuffix("+PTX").replace(".", "")
            assert f"-gencode=arch=compute_{arch},code=sm_{arch}" in info.nvcc_flags
    else:
        assert info.cpu_only_reason
    assert re.fullmatch(r"cp3\d+", info.py_limited_api)
    assert info.git_revision is None or re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", info.git_revision)
    assert _loader.BuildInfo.from_dict(info.as_dict()) == info
    assert torch.__version__ in str(info)


def test_build_info_ignores_fields_it_does_not_know():
    info = _loader.BuildInfo.from_dict({"torch": "2.0.0", "cxx_flags": ["-O3"], "added_later": 1})
    assert info.torch == "2.0.0" and info.cxx_flags == ("-O3",) and not info.with_cuda


def test_same_torch_is_accepted():
    _loader.check_torch_version(torch.__version__, torch.__version__)


@pytest.mark.parametrize("built_for", ["2.0.0", "2.14.1+cpu", torch.__version__ + ".post1"])
def test_other_torch_is_refused_with_the_fix(built_for):
    with pytest.raises(ImportError) as error:
        _loader.check_torch_version(built_for, torch.__version__)
    message = str(error.value)
    assert f"built for torch {built_for}, but torch {torch.__version__} is installed" in message
    assert REBUILD in message


def test_other_torch_is_refused_before_loading(tmp_path):
    # The library is garbage: reaching the loader would give a different error.
    package = write_package(tmp_path, "1.0.0+other")
    with pytest.raises(ImportError, match=r"built for torch 1\.0\.0\+other, but torch .* is installed"):
        _loader.load_operator_library(package)


def test_importing_under_another_torch_fails_with_the_fix():
    # The real package in a fresh interpreter whose torch reports another version.
    package_parent = Path(mla_ext.__file__).resolve().parent.parent
    code = "import torch; torch.__version__ = '2.0.0+other'; import mla_ext"
    result = subprocess.run([sys.executable, "-c", code], cwd=package_parent, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0
    expected = f"mla_ext was built for torch {mla_ext.build_info.torch}, but torch 2.0.0+other is installed"
    assert expected in result.stderr
    assert REBUILD in result.stderr


def test_unloadable_library_says_what_it_was_built_for(tmp_path):
    package = write_package(tmp_path, torch.__version__)
    with pytest.raises(ImportError) as error:
        _loader.load_operator_library(package)
    message = str(error.value)
    assert "could not load _C.abi3.so" in message and f"built for torch {torch.__version__}" in message
    assert REBUILD in message


def test_missing_library_says_how_to_build(tmp_path):
    with pytest.raises(ImportError, match=r"compiled operator library \(_C\) is missing.*pip install"):
        _loader.load_operator_library(tmp_path)


# (compiled archs, device compute capability, runs): SASS runs on later minors of its major only, arch-specific
# SASS (9.0a) on exactly its capability, PTX on its capability and every later one.
ARCH_CASES = [
    ("8.0+PTX;9.0a", (8, 0), True),
    ("8.0+PTX;9.0a", (8, 6), True),
    ("8.0+PTX;9.0a", (8, 9), True),
    ("8.0+PTX;9.0a", (9, 0), True),
    ("8.0+PTX;9.0a", (10, 0), True),
    ("8.0+PTX;9.0a", (12, 0), True),
    ("8.0+PTX;9.0a", (7, 5), False),
    ("8.0;9.0a", (10, 0), False),
    ("8.0;9.0a", (8, 6), True),
    ("9.0a", (9, 0), True),
    ("9.0a", (8, 0), False),
    ("9.0a", (10, 0), False),
    ("9.0a+PTX", (10, 0), False),
    ("9.0", (9, 0), True),
    ("8.6", (8, 0), False),
    ("8.6", (8, 9), True),
    ("8.0", (9, 0), False),
    ("8.0+PTX", (9, 0), True),
    ("10.0", (10, 3), True),
    ("10.0;12.0", (11, 0), False),
]


@pytest.mark.parametrize(("archs", "capability", "runs"), ARCH_CASES)
def test_architecture_rule(archs, capability, runs):
    assert (torch.ops.mla._cuda_arch_error(*capability, archs) == "") == runs


def test_missing_architecture_error_says_how_to_rebuild():
    message = torch.ops.mla._cuda_arch_error(10, 0, "8.0;9.0a")
    assert "compiled for compute capabilities 8.0;9.0a" in message
    assert "compute capability 10.0" in message
    assert 'MLA_EXT_CUDA_ARCHS="8.0;9.0a;10.0" pip install --no-build-isolation' in message


def test_too_old_gpu_error_says_it_is_unsupported():
    message = torch.ops.mla._cuda_arch_error(7, 5, "8.0+PTX;9.0a")
    assert "compute capability 7.5" in message and "need compute capability 8.0 or newer" in message


def test_cpu_only_build_error_says_how_to_get_cuda():
    message = torch.ops.mla._cuda_arch_error(9, 0, "")
    assert "built without CUDA kernels" in message and "MLA_EXT_FORCE_CUDA=1 pip install" in message


def test_default_architectures_are_this_builds():
    message = torch.ops.mla._cuda_arch_error(7, 0)
    if mla_ext.build_info.with_cuda:
        assert f"compiled for compute capabilities {mla_ext.build_info.cuda_archs} " in message
    else:
        assert "built without CUDA kernels" in message


@requires_cuda
def test_this_gpu_is_supported_by_this_build():
    assert mla_ext.build_info.with_cuda
    assert torch.ops.mla._cuda_arch_error(*torch.cuda.get_device_capability()) == ""
