#!/usr/bin/env bash
# Sets up the machine, builds mla_ext, and runs the test suite (CUDA tests skip without a GPU).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k paged`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
"$PYTHON" -m pytest -q tests "$@"
