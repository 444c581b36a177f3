#!/usr/bin/env bash
# Sets up the machine, builds mla_ext, and runs the demo: a few decode steps of a small DeepSeek-shaped MLA layer
# over a paged cache, checked against a float64 reference (GPU if present, else CPU).
# Extra arguments go to the demo, e.g. `bash scripts/demo.sh --device cuda --steps 16`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
"$PYTHON" -m mla_ext.demo "$@"
