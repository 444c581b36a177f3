#!/usr/bin/env bash
# CI: builds the wheel the way the README says, installs it into a fresh virtualenv that shares the installed torch
# (and nothing of the source tree), and smoke-tests it from outside the source tree.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
"$PYTHON" -m pip wheel --quiet --no-build-isolation --no-deps . -w "$work/dist"
wheel=("$work"/dist/mla_ext-*.whl)
echo "wheel: built $(basename "${wheel[0]}")"

"$PYTHON" -m venv --system-site-packages "$work/venv"
# The wheel file itself (a development install of mla_ext in the shared site-packages must not satisfy it), and no
# dependencies: torch and numpy come from the shared site-packages, as they would beside the torch it was built for.
"$work/venv/bin/python" -m pip install --quiet --no-index --no-deps --force-reinstall "${wheel[0]}"
cd "$work"
"$work/venv/bin/python" "$OLDPWD/scripts/smoke_test.py" --expect-under "$work/venv"
