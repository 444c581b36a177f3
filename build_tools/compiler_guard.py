"""Keeps setup.py off a C++ compiler that links libstdc++ statically into the extension.

Such a library builds and loads, but a C++ exception it throws into torch (every argument error) meets torch's own
libstdc++, unwinding fails and Python dies with a segfault instead of raising. The probe links a tiny shared
library that throws and reads whether it needs libstdc++.so; the guard keeps a compiler that does, switches to the
system g++ when the given one does not, and otherwise stops the build with the fix.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, MutableMapping
from pathlib import Path

ALLOW_STATIC_ENV = "MLA_EXT_ALLOW_STATIC_LIBSTDCXX"
FALLBACK_COMPILERS = ("/usr/bin/g++", "g++")

# Throws, so the library cannot link without libstdc++ (shared, or copied in).
_PROBE_SOURCE = """#include <stdexcept>
extern "C" void mla_ext_probe(int n) { if (n < 0) throw std::runtime_error("probe"); }
"""


def _run(command: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None


def _links_dynamically(library: Path) -> bool | None:
    """Whether the shared library needs libstdc++.so; None when no tool here can tell."""
    for tool in (["readelf", "-d"], ["objdump", "-p"]):
        done = _run([*tool, str(library)]) if shutil.which(tool[0]) else None
        if done is not None and done.returncode == 0:
            needed = [line for line in done.stdout.splitlines() if "NEEDED" in line]
            return any("libstdc++.so" in line for line in needed)
    # A statically linked libstdc++ leaves its throw routine defined in the library itself.
    if shutil.which("nm"):
        done = _run(["nm", "-D", "--defined-only", str(library)])
        if done is not None and done.returncode == 0:
            return not any(line.split()[-1:] == ["__cxa_throw"] for line in done.stdout.splitlines())
    if shutil.which("ldd"):
        done = _run(["ldd", str(library)])
        if done is not None and done.returncode == 0:
            return "libstdc++.so" in done.stdout
    return None


def links_libstdcxx_dynamically(compiler: str) -> bool | None:
    """True when `compiler` (a command, possibly with arguments, as CXX may hold) links a shared library against
    libstdc++.so; False when it copies libstdc++ in; None when it cannot build the probe or nothing can read it."""
    with tempfile.TemporaryDirectory(prefix="mla_ext_probe_") as folder:
        source, library = Path(folder) / "probe.cpp", Path(folder) / "probe.so"
        source.write_text(_PROBE_SOURCE)
        done = _run([*shlex.split(compiler), "-shared", "-fPIC", str(source), "-o", str(library)])
        if done is None or done.returncode != 0 or not library.exists():
            return None
        return _links_dynamically(library)


def matching_c_compiler(cxx: str) -> str | None:
    """The C compiler beside a g++ (/usr/bin/g++-12 -> /usr/bin/gcc-12), for CC and so nvcc's host compiler."""
    path = Path(shutil.which(cxx) or cxx)
    if "g++" not in path.name:
        return None
    sibling = path.with_name(path.name.replace("g++", "gcc"))
    return str(sibling) if sibling.exists() else None


def settle_cxx(environ: MutableMapping[str, str] = os.environ, fallbacks: Iterable[str] = FALLBACK_COMPILERS) -> str:
    """The C++ compiler the build should use (CXX, else c++), after making sure it links libstdc++ dynamically.

    When it does not, the first fallback that does becomes CXX, its gcc becomes CC (torch passes CC to nvcc as
    -ccbin, so host code and link agree), and a message says so. With none, raises SystemExit naming the fix, unless
    MLA_EXT_ALLOW_STATIC_LIBSTDCXX=1. A compiler the probe cannot judge is kept: the build then reports its errors.
    """
    cxx = environ.get("CXX") or "c++"
    if links_libstdcxx_dynamically(cxx) is not False:
        return cxx
    problem = (f"mla_ext: the C++ compiler {cxx!r} links libstdc++ statically; C++ exceptions thrown by the "
               "extension (argument errors) would then crash Python instead of raising")  # fmt: skip
    if environ.get(ALLOW_STATIC_ENV) == "1":
        print(f"{problem}. Building with it anyway, as {ALLOW_STATIC_ENV}=1 asks.")
        return cxx
    tried = {shutil.which(cxx) or cxx}
    for candidate in fallbacks:
        resolved = shutil.which(candidate)
        if resolved is None or resolved in tried:
            continue
        tried.add(resolved)
        if links_libstdcxx_dynamically(resolved):
            environ["CXX"] = resolved
            c_compiler = matching_c_compiler(resolved)
            if c_compiler:
                environ["CC"] = c_compiler
            print(f"{problem}. Switching to CXX={resolved}" + (f", CC={c_compiler}" if c_compiler else "") + ".")
            return resolved
    raise SystemExit(f"{problem}, and no fallback compiler links it dynamically. Set CXX=/usr/bin/g++ (a compiler "
                     f"that links libstdc++ dynamically), or {ALLOW_STATIC_ENV}=1 to build anyway.")  # fmt: skip
