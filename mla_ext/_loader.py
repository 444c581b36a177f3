"""Finds and loads the compiled operator library, and says clearly why when it cannot."""

from pathlib import Path

import torch

_PACKAGE_DIR = Path(__file__).resolve().parent
_REBUILD = "rebuild it against the installed torch: pip install --no-build-isolation -e . (from the source tree)"


def _build_info():
    try:
        from ._build_info import BUILD_INFO
    except ImportError:
        return None
    return BUILD_INFO


def load_operator_library():
    """Loads mla_ext/_C*.so (it holds only TORCH_LIBRARY registrations, no Python module) and returns the build
    metadata recorded by setup.py."""
    info = _build_info()
    libraries = sorted(_PACKAGE_DIR.glob("_C*.so")) + sorted(_PACKAGE_DIR.glob("_C*.pyd"))
    if not libraries:
        raise ImportError(f"mla_ext: the compiled operator library (_C) is missing from {_PACKAGE_DIR}; build it "
                          "with: pip install --no-build-isolation -e .")
    try:
        torch.ops.load_library(str(libraries[0]))
    except OSError as error:
        built_for = info["torch"] if info else "an unknown torch"
        raise ImportError(f"mla_ext: could not load {libraries[0].name}: built for torch {built_for}, running "
                          f"torch {torch.__version__}; {_REBUILD}. Loader said: {error}") from error
    if info and info["torch"] != torch.__version__:
        raise ImportError(f"mla_ext was built for torch {info['torch']} but torch {torch.__version__} is "
                          f"installed; {_REBUILD}")
    return info
