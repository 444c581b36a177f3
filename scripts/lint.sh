#!/usr/bin/env bash
# Lint: ruff over the Python tree, clang-format (check only) over the C++/CUDA sources. Installs the pinned tool
# versions when missing, so every machine judges the same way. `bash scripts/lint.sh --fix` rewrites instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
RUFF_VERSION=0.17.6
CLANG_FORMAT_VERSION=23.1.3

installed_version() { "$PYTHON" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true; }
for tool in "ruff==$RUFF_VERSION" "clang-format==$CLANG_FORMAT_VERSION"; do
  if [[ "$(installed_version "${tool%%==*}")" != "${tool##*==}" ]]; then
    echo "lint: installing $tool"
    "$PYTHON" -m pip install --quiet "$tool"
  fi
done
clang_format="$("$PYTHON" -c 'import clang_format; print(clang_format.get_executable("clang-format"))')"

mapfile -t cxx_sources < <(git ls-files --cached --others --exclude-standard -- \
  'csrc/*.h' 'csrc/*.cpp' 'csrc/*.cuh' 'csrc/*.cu' 'examples/*.cpp' 'tests/cpp/*.cpp')
if [[ "${1:-}" == "--fix" ]]; then
  "$PYTHON" -m ruff check --fix .
  "$clang_format" -i "${cxx_sources[@]}"
else
  "$PYTHON" -m ruff check .
  "$clang_format" --dry-run --Werror "${cxx_sources[@]}"
fi
echo "lint: ruff $RUFF_VERSION and clang-format $CLANG_FORMAT_VERSION clean (${#cxx_sources[@]} C++/CUDA files)"
