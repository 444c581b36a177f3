"""Builds mla_ext._C ahead of time: the mla operator library (CPU always, CUDA when torch and nvcc allow).

Environment knobs:
  MLA_EXT_CUDA=0            build the CPU kernel only, even where CUDA is available
  MLA_EXT_FORCE_CUDA=1      fail instead of falling back to a CPU-only build
  MLA_EXT_CUDA_ARCHS        ';'-separated compute capabilities, '+PTX' embeds PTX too (default "8.0+PTX;9.0a")
  MLA_EXT_NVCC_THREADS      nvcc --threads per compile job (default 4)
  MAX_JOBS                  parallel compile jobs (torch's ninja builder)
  CUDA_HOME / CUDA_PATH     the CUDA toolkit root (found from nvcc when unset)
"""

import os
import re
import shutil
import subprocess
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


def cuda_gencode_flags(spec):
    """'8.0+PTX;9.0a' -> -gencode flags: SASS for each arch, PTX where '+PTX' is given."""
    flags = []
    for entry in filter(None, (e.strip() for e in spec.replace(",", ";").split(";"))):
        match = re.fullmatch(r"(\d+)\.(\d+)(a?)(\+PTX)?", entry)
        if not match:
            raise ValueError(f"MLA_EXT_CUDA_ARCHS entry {entry!r} is not like '8.0', '9.0a' or '8.0+PTX'")
        arch = f"{match.group(1)}{match.group(2)}{match.group(3)}"
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
        if match.group(4):
            flags.append(f"-gencode=arch=compute_{arch},code=compute_{arch}")
    return flags


# torch reads CUDA_HOME when cpp_extension is imported, so settle it first.
_cuda_home = find_cuda_home()
if _cuda_home:
    os.environ["CUDA_HOME"] = _cuda_home

import torch  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402

CPU_SOURCES = [
    "csrc/ops.cpp",
    "csrc/decode_args.cpp",
    "csrc/cpu/ops_cpu.cpp",
    "csrc/cpu/decode_cpu.cpp",
]
CUDA_SOURCES = [
    "csrc/cuda/decode_cuda.cpp",
    "csrc/cuda/split_plan.cpp",
    "csrc/cuda/instantiations/fp16.cu",
    "csrc/cuda/instantiations/bf16.cu",
    "csrc/cuda/instantiations/fp32.cu",
]


def want_cuda():
    if os.environ.get("MLA_EXT_CUDA", "1") == "0":
        return False, "MLA_EXT_CUDA=0"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is not a CUDA build"
    if _cuda_home is None:
        return False, "no CUDA toolkit found (set CUDA_HOME)"
    return True, ""


def build_info(with_cuda, archs):
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda if with_cuda else None,
        "cuda_archs": archs if with_cuda else None,
    }


def make_extension():
    with_cuda, reason = want_cuda()
    if not with_cuda:
        if os.environ.get("MLA_EXT_FORCE_CUDA") == "1":
            raise RuntimeError(f"MLA_EXT_FORCE_CUDA=1 but the CUDA build is off: {reason}")
        print(f"mla_ext: building the CPU kernel only ({reason})")
    cxx = ["-O3", "-fopenmp"]
    if not with_cuda:
        return CppExtension("mla_ext._C", CPU_SOURCES, extra_compile_args={"cxx": cxx},
                            extra_link_args=["-fopenmp"]), build_info(False, None)
    archs = os.environ.get("MLA_EXT_CUDA_ARCHS", DEFAULT_CUDA_ARCHS)
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
    ext = CUDAExtension(
        "mla_ext._C",
        CPU_SOURCES + CUDA_SOURCES,
        extra_compile_args={"cxx": cxx + ["-DMLA_EXT_WITH_CUDA"], "nvcc": nvcc},
        extra_link_args=["-fopenmp"],
    )
    return ext, build_info(True, archs)


class BuildWithInfo(BuildExtension):
    """Records what the extension was built against, so a load failure can say so (mla_ext/_build_info.py)."""

    def run(self):
        info_path = ROOT / "mla_ext" / "_build_info.py"
        info_path.write_text("# Written by setup.py at build time.\nBUILD_INFO = " + repr(BUILD_INFO) + "\n")
        super().run()


EXTENSION, BUILD_INFO = make_extension()

setup(
    ext_modules=[EXTENSION],
    cmdclass={"build_ext": BuildWithInfo},
)
