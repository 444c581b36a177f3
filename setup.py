"""Builds mla_ext._C ahead of time: the mla operator library (CPU always, CUDA when torch and nvcc allow).

    pip install --no-build-isolation -e .                      # develop in place
    pip wheel --no-build-isolation --no-deps . -w dist         # a wheel for this torch and every CPython it supports

Environment knobs:
  MLA_EXT_CUDA=0            build the CPU kernel only, even where CUDA is available
  MLA_EXT_FORCE_CUDA=1      fail instead of falling back to a CPU-only build
  MLA_EXT_CUDA_ARCHS        ';'-separated compute capabilities, '+PTX' embeds PTX too (default "8.0+PTX;9.0a")
  MLA_EXT_NVCC_THREADS      nvcc --threads per compile job (default 4)
  MLA_EXT_GIT_REVISION      revision to record in build_info when building outside a git checkout
  MAX_JOBS                  parallel compile jobs (torch's ninja builder)
  CUDA_HOME / CUDA_PATH     the CUDA toolkit root (found from nvcc when unset)
  CXX / CC                  the C++ compiler (default c++) and the C compiler torch hands nvcc as its host compiler
  MLA_EXT_ALLOW_STATIC_LIBSTDCXX=1
                            build even with a CXX that links libstdc++ statically (see below); not recommended

The sources come from csrc/sources.txt (shared with CMakeLists.txt). Before compiling, build_tools/compiler_guard.py
checks that CXX links libstdc++ dynamically: a statically linked copy makes every C++ exception thrown into torch (an
argument error) crash Python. When CXX does not, the build switches to the system g++ (and its gcc as CC) if that
one does, and stops with the fix otherwise. build_info records the compiler that was used.

The library holds only TORCH_LIBRARY registrations and no Python module, so it is built against the stable ABI
(py_limited_api): one wheel per torch version serves every CPython that torch supports.
"""

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
DEFAULT_CUDA_ARCHS = "8.0+PTX;9.0a"


def _is_cuda_root(path):
    root = Path(path)
    has_lib = (root / "lib64").is_dir() or (root / "lib").is_dir()
    return (root / "bin" / "nvcc").exists() and (root / "include" / "cuda_runtime.h").exists() and has_lib


def find_cuda_home():
    """The toolkit root: CUDA_HOME / CUDA_PATH when they hold a toolkit, else the TOP that nvcc on PATH reports
    (nvcc may be a wrapper script somewhere else, so its own location proves nothing), else /usr/local/cuda."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var) and _is_cuda_root(os.environ[var]):
            return str(Path(os.environ[var]).resolve())
    nvcc = shutil.which("nvcc")
    if nvcc:
        try:
            probe = subprocess.run(
                [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                capture_output=True, text=True, timeout=60,
            )
            match = re.search(r"^#\$ TOP=(.+)$", probe.stdout + probe.stderr, re.MULTILINE)
            if match and _is_cuda_root(match.group(1).strip()):
                return str(Path(match.group(1).strip()).resolve())
        except (OSError, subprocess.SubprocessError):
            pass
        guess = Path(nvcc).resolve().parent.parent
        if _is_cuda_root(guess):
            return str(guess)
    if _is_cuda_root("/usr/local/cuda"):
        return "/usr/local/cuda"
    return None


def normalize_cuda_archs(spec):
    """'8.0+PTX, 9.0a' -> '8.0+PTX;9.0a'; raises on an entry that is not like '8.0', '9.0a' or '8.0+PTX'."""
    entries = [e.strip() for e in spec.replace(",", ";").split(";") if e.strip()]
    for entry in entries:
        if not re.fullmatch(r"\d+\.\d+a?(\+PTX)?", entry):
            raise ValueError(f"MLA_EXT_CUDA_ARCHS entry {entry!r} is not like '8.0', '9.0a' or '8.0+PTX'")
    if not entries:
        raise ValueError("MLA_EXT_CUDA_ARCHS is empty; give at least one compute capability, e.g. '9.0a'")
    return ";".join(entries)


def cuda_gencode_flags(spec):
    """'8.0+PTX;9.0a' -> -gencode flags: SASS for each arch, PTX where '+PTX' is given."""
    flags = []
    for entry in normalize_cuda_archs(spec).split(";"):
        arch = entry.removesuffix("+PTX").replace(".", "")
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
        if entry.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{arch},code=compute_{arch}")
    return flags


# torch reads CUDA_HOME when cpp_extension is imported, so settle it first.
_cuda_home = find_cuda_home()
if _cuda_home:
    os.environ["CUDA_HOME"] = _cuda_home

import torch  # noqa: E402
import torch.utils.cpp_extension as cpp_extension  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402


def read_sources(kind, path=ROOT / "csrc" / "sources.txt"):
    """The sources of one kind ("cpu" or "cuda") from the list setup.py and CMakeLists.txt share: lines
    "<kind> <path>", '#' starts a comment."""
    sources = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2 or fields[0] not in ("cpu", "cuda"):
            raise ValueError(f"{path}:{number}: expected 'cpu <path>' or 'cuda <path>', got {line.strip()!r}")
        if fields[0] == kind:
            sources.append(fields[1])
    return sources


def load_compiler_guard():
    """build_tools/compiler_guard.py, loaded by path: setup.py runs without the source tree on sys.path."""
    spec = importlib.util.spec_from_file_location("mla_ext_compiler_guard", ROOT / "build_tools" / "compiler_guard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CPU_SOURCES = read_sources("cpu")
CUDA_SOURCES = read_sources("cuda")
# The C++ and CUDA sources include each other by their path under csrc/ ("cuda/common/device_primitives.cuh").
INCLUDE_DIRS = [str(ROOT / "csrc")]


def limited_api_tag():
    """The wheel's stable-ABI tag, matching the Py_LIMITED_API value torch compiles the extension with."""
    minimum = int(getattr(cpp_extension, "min_supported_cpython", "0x03090000"), 16)
    return f"cp{minimum >> 24}{(minimum >> 16) & 0xFF}"


def want_cuda():
    if os.environ.get("MLA_EXT_CUDA", "1") == "0":
        return False, "MLA_EXT_CUDA=0"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is not a CUDA build"
    if _cuda_home is None:
        return False, "no CUDA toolkit found (set CUDA_HOME)"
    return True, ""


def nvcc_version():
    """'13.0' from the toolkit's nvcc, or None when it cannot be asked."""
    try:
        text = subprocess.run([str(Path(_cuda_home) / "bin" / "nvcc"), "--version"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", text)
    return match.group(1) if match else None


def compiler_description(compiler):
    """'/usr/bin/g++: g++ (Ubuntu 13.2.0-4ubuntu3) 13.2.0': the command and its version line."""
    try:
        lines = subprocess.run([*shlex.split(compiler), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        lines = ""
    return f"{compiler}: {lines.splitlines()[0]}" if lines else compiler


def git_revision():
    """HEAD of the source checkout ('+dirty' when tracked files differ), else MLA_EXT_GIT_REVISION, else None."""
    if os.environ.get("MLA_EXT_GIT_REVISION"):
        return os.environ["MLA_EXT_GIT_REVISION"]
    if not (ROOT / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def make_extension():
    """The extension and the build facts recorded next to it (mla_ext/_build_info.py)."""
    with_cuda, reason = want_cuda()
    if not with_cuda:
        if os.environ.get("MLA_EXT_FORCE_CUDA") == "1":
            raise RuntimeError(f"MLA_EXT_FORCE_CUDA=1 but the CUDA build is off: {reason}")
        print(f"mla_ext: building the CPU kernel only ({reason})")
    cxx = ["-O3", "-fopenmp"]
    info = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda": None,
        "cuda_archs": None,
        "cpu_only_reason": None if with_cuda else reason,
        "cxx11_abi": torch.compiled_with_cxx11_abi(),
        "py_limited_api": limited_api_tag(),
        "git_revision": git_revision(),
    }
    if not with_cuda:
        # The compiled-arch list is empty, so the CUDA stubs say the build is CPU only.
        cxx.append('-DMLA_EXT_CUDA_ARCHS=""')
        info.update(cxx_flags=cxx, nvcc_flags=[])
        ext = CppExtension("mla_ext._C", CPU_SOURCES, include_dirs=INCLUDE_DIRS, extra_compile_args={"cxx": cxx},
                           extra_link_args=["-fopenmp"], py_limited_api=True)
        return ext, info
    archs = normalize_cuda_archs(os.environ.get("MLA_EXT_CUDA_ARCHS", DEFAULT_CUDA_ARCHS))
    # The CUDA glue compares the device against this list, so a missing arch is named rather than reported as
    # "no kernel image is available".
    cxx += ["-DMLA_EXT_WITH_CUDA", f'-DMLA_EXT_CUDA_ARCHS="{archs}"']
    nvcc = [
        "-O3",
        "--expt-relaxed-constexpr",
        "-lineinfo",
        f"--threads={os.environ.get('MLA_EXT_NVCC_THREADS', '4')}",
        # torch turns off the half/bf16 operators by default; the kernels convert explicitly anyway.
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        *cuda_gencode_flags(archs),
    ]
    info.update(cuda=nvcc_version(), cuda_archs=archs, cxx_flags=cxx, nvcc_flags=nvcc)
    ext = CUDAExtension(
        "mla_ext._C",
        CPU_SOURCES + CUDA_SOURCES,
        include_dirs=INCLUDE_DIRS,
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
        extra_link_args=["-fopenmp"],
        py_limited_api=True,
    )
    return ext, info


class BuildWithInfo(BuildExtension):
    """Settles the C++ compiler (build_tools/compiler_guard.py) before compiling, then writes mla_ext/_build_info.py
    beside the built library (in the source tree for in-place builds, in the wheel's staging folder otherwise), so
    the package can say what it was built against."""

    def run(self):
        # Here rather than at import: egg_info and sdist need no compiler. CXX and CC are read when compiling.
        cxx = load_compiler_guard().settle_cxx(os.environ)
        super().run()
        info = dict(BUILD_INFO, version=self.distribution.get_version(), python=sys.version.split()[0],
                    compiler=compiler_description(cxx))
        info_path = Path(self.get_ext_fullpath("mla_ext._C")).parent / "_build_info.py"
        info_path.parent.mkdir(parents=True, exist_ok=True)
        info_path.write_text("# Written by setup.py at build time; read through mla_ext.build_info.\n"
                             f"BUILD_INFO = {info!r}\n")


EXTENSION, BUILD_INFO = make_extension()

setup(
    ext_modules=[EXTENSION],
    cmdclass={"build_ext": BuildWithInfo},
    package_data={"mla_ext": ["py.typed"]},
    options={"bdist_wheel": {"py_limited_api": limited_api_tag()}},
)
