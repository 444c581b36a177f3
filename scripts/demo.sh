#!/usr/bin/env bash
# Sets up the machine, builds mla_ext, and runs the demo: a small DeepSeek-shaped 4-layer MLA attention stack
# generating tokens over a paged cache that grows page by page, with mla_ext and with plain PyTorch, checked against
# a float64 stack and timed (GPU if present, else CPU).
# Extra arguments go to the demo, e.g. `bash scripts/demo.sh --device cuda --graphs`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
"$PYTHON" -m examples.demo.demo "$@"
