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
# --system-site-packages shares the base interpreter's packages; where torch lives in another virtualenv (the one
# running this script), point the new one at that site-packages as well.
if ! "$work/venv/bin/python" -c "import torch" 2>/dev/null; then
  torch_site=$("$PYTHON" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
  venv_site=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$torch_site" >"$venv_site/shared_torch.pth"
fi
# The wheel file itself (a development install of mla_ext in the shared site-packages must not satisfy it), and no
# dependencies: torch and numpy come from the shared site-packages, as they would beside the torch it was built for.
"$work/venv/bin/python" -m pip install --quiet --no-index --no-deps --force-reinstall "${wheel[0]}"
cd "$work"
"$work/venv/bin/python" "$OLDPWD/scripts/smoke_test.py" --expect-under "$work/venv"
