"""Finds and loads the compiled operator library, after checking that it was built for the running torch."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import torch

_PACKAGE_DIR = Path(__file__).resolve().parent
REBUILD_HINT = (
    "rebuild mla_ext against the installed torch, from its source tree: "
    "pip install --no-build-isolation --no-deps . (or pip install --no-build-isolation -e . to develop)"
)


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """What ``mla_ext._C`` was built from and against, recorded by setup.py at build time (``mla_ext.build_info``).

    A field is None where the build did not record it (or it does not apply: ``cuda`` of a CPU-only build).
    """

    version: str | None = None  # mla_ext's version
    torch: str | None = None  # torch.__version__ at build time; the running torch must be the same
    torch_cuda: str | None = None  # CUDA version of that torch (torch.version.cuda)
    cuda: str | None = None  # CUDA toolkit that compiled the kernels; None for a CPU-only build
    cuda_archs: str | None = None  # compute capabilities compiled in, MLA_EXT_CUDA_ARCHS notation: "8.0+PTX;9.0a"
    cpu_only_reason: str | None = None  # why a CPU-only build has no CUDA kernels
    cxx_flags: tuple[str, ...] = ()  # extra C++ compiler flags
    nvcc_flags: tuple[str, ...] = ()  # extra nvcc flags, including the -gencode list
    compiler: str | None = None  # the C++ compiler that built it and its version line
    cxx11_abi: bool | None = None  # torch's _GLIBCXX_USE_CXX11_ABI
    python: str | None = None  # the Python that ran the build (the library itself uses no Python API)
    py_limited_api: str | None = None  # stable-ABI wheel tag, e.g. "cp310": the wheel fits that CPython and later
    git_revision: str | None = None  # source commit, "+dirty" when tracked files had changes

    @property
    def with_cuda(self) -> bool:
        """Whether the library holds CUDA kernels."""
        return self.cuda_archs is not None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        cuda = f"CUDA {self.cuda} for {self.cuda_archs}" if self.with_cuda else f"CPU only ({self.cpu_only_reason})"
        return (f"mla_ext {self.version} built for torch {self.torch}, {cuda}, at revision "
                f"{self.git_revision or 'unknown'}")

    @classmethod
    def from_dict(cls, recorded: dict[str, Any]) -> BuildInfo:
        """Keeps the fields this version knows; tuples for the flag lists."""
        known = {field.name for field in dataclasses.fields(cls)}
        values = {key: value for key, value in recorded.items() if key in known}
        for key in ("cxx_flags", "nvcc_flags"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)


def read_build_info(package_dir: Path = _PACKAGE_DIR) -> BuildInfo | None:
    """The BuildInfo that setup.py wrote to ``_build_info.py``, read without importing it; None when absent."""
    path = package_dir / "_build_info.py"
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BUILD_INFO" for t in node.targets):
            return BuildInfo.from_dict(ast.literal_eval(node.value))
    return None


def check_torch_version(built_for: str, running: str) -> None:
    """Raises ImportError unless the library was built for the running torch: C++ extensions have no stable ABI
    across torch versions, so a mismatch fails to load at best and corrupts memory at worst."""
    if built_for != running:
        raise ImportError(f"mla_ext was built for torch {built_for}, but torch {running} is installed; {REBUILD_HINT}")


def find_library(package_dir: Path = _PACKAGE_DIR) -> Path:
    """The compiled library: _C.abi3.so (or an older build's _C.<python tag>.so); the newest when several remain."""
    libraries = [*package_dir.glob("_C*.so"), *package_dir.glob("_C*.pyd")]
    if not libraries:
        raise ImportError(f"mla_ext: the compiled operator library (_C) is missing from {package_dir}; build it from "
                          "the source tree with: pip install --no-build-isolation -e .")
    return max(libraries, key=lambda path: path.stat().st_mtime)


def load_operator_library(package_dir: Path = _PACKAGE_DIR) -> BuildInfo:
    """Checks the recorded build against the running torch, then loads the library, whose static TORCH_LIBRARY
    registrations define torch.ops.mla.*. Returns the recorded BuildInfo (all None when none was recorded)."""
    library = find_library(package_dir)
    info = read_build_info(package_dir)
    if info is not None and info.torch is not None:
        check_torch_version(info.torch, torch.__version__)
    try:
        torch.ops.load_library(str(library))
    except OSError as error:
        built_for = info.torch if info is not None and info.torch else "an unrecorded torch"
        raise ImportError(f"mla_ext: could not load {library.name} (built for torch {built_for}, running torch "
                          f"{torch.__version__}); {REBUILD_HINT}. The loader said: {error}") from error
    return info if info is not None else BuildInfo()
