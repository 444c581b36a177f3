#!/usr/bin/env bash
# CI: builds the operator library and the C++ example with CMake, as a libtorch user would, and runs them under
# ctest. CPU only by default (setup.py's build already compiles and tests the CUDA kernels); MLA_EXT_CMAKE_CUDA=ON
# builds the CUDA kernels too and adds the CUDA check (skipped without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
with_cuda="${MLA_EXT_CMAKE_CUDA:-OFF}"
build="build/cmake-$([[ "$with_cuda" == ON ]] && echo cuda || echo cpu)"

mkdir -p "$build"
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DMLA_EXT_WITH_CUDA="$with_cuda" \
  -DCMAKE_PREFIX_PATH="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')" >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" --parallel "${MAX_JOBS:-$(nproc)}"
ctest --test-dir "$build" --output-on-failure
