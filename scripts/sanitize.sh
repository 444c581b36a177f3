#!/usr/bin/env bash
# Runs the sanitizer case matrix (scripts/sanitize_cases.py) under NVIDIA compute-sanitizer: memcheck over every
# case, racecheck and synccheck over one small case per kernel variant. GPU only (not part of CI).
#
#   bash scripts/sanitize.sh                       # all three tools
#   bash scripts/sanitize.sh memcheck              # one tool (memcheck, racecheck, synccheck, initcheck)
#   SANITIZE_ONLY=page16 bash scripts/sanitize.sh  # only cases whose name contains "page16"
#
# On Hopper each tool runs a second pass over the one-case-per-kernel subset with MLA_EXT_DISABLE_SM90=1, which runs
# the portable kernels in the configurations an A100 runs (Hopper takes its own otherwise).
#
# Prints each tool's error summary and exits 1 on any sanitizer error or wrong result, 2 without a GPU or without
# compute-sanitizer. Logs go to $SANITIZE_LOG_DIR (default: a new temporary folder). COMPUTE_SANITIZER names the
# binary; SANITIZER_EXTRA_ARGS adds options to every run.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "sanitize: no CUDA device visible to torch; this script checks the CUDA kernels and needs a GPU" >&2
  exit 2
fi

find_sanitizer() {
  local candidate
  for candidate in "${COMPUTE_SANITIZER:-}" "$(command -v compute-sanitizer 2>/dev/null)" \
    "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer \
    $(ls -d /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | sort -V -r); do
    if [[ -n "$candidate" && -x "$candidate" ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
if ! SANITIZER="$(find_sanitizer)"; then
  echo "sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER, or put the CUDA toolkit's bin on PATH)" >&2
  exit 2
fi

LOG_DIR="${SANITIZE_LOG_DIR:-$(mktemp -d -t mla_sanitize.XXXXXX)}"
mkdir -p "$LOG_DIR"
TOOLS=("$@")
if [[ ${#TOOLS[@]} -eq 0 ]]; then
  TOOLS=(memcheck racecheck synccheck)
fi
ONLY_ARGS=()
if [[ -n "${SANITIZE_ONLY:-}" ]]; then
  ONLY_ARGS=(--only "$SANITIZE_ONLY")
fi
read -r -a EXTRA_ARGS <<<"${SANITIZER_EXTRA_ARGS:-}"

echo "sanitize: $("$SANITIZER" --version 2>/dev/null | tail -n 1) ($SANITIZER); logs in $LOG_DIR"
# Hopper runs the portable kernels in its own configurations; a second pass per tool, one small case per kernel
# variant with MLA_EXT_DISABLE_SM90=1, checks the configurations an A100 runs.
PASSES=(default)
if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.get_device_capability()[0] == 9 else 1)'; then
  PASSES+=(a100)
fi
status=0
summary=()
for tool in "${TOOLS[@]}"; do
  case "$tool" in
    memcheck) tool_subset=all ;;
    racecheck | synccheck | initcheck) tool_subset=kernels ;;
    *)
      echo "sanitize: unknown tool '$tool' (memcheck, racecheck, synccheck, initcheck)" >&2
      exit 2
      ;;
  esac
  tool_args=(--tool "$tool")
  # racecheck: print the analysed hazards (one line per race, not per access).
  [[ "$tool" == racecheck ]] && tool_args+=(--racecheck-report analysis)
  for pass in "${PASSES[@]}"; do
    subset=$tool_subset
    log="$LOG_DIR/$tool.log"
    label="$subset"
    pass_env=()
    if [[ "$pass" == a100 ]]; then
      subset=kernels
      log="$LOG_DIR/$tool.a100.log"
      label="kernels, A100 configurations"
      pass_env=(MLA_EXT_DISABLE_SM90=1)
    fi
    start=$SECONDS
    # Without the caching allocator every tensor is its own allocation, so memcheck sees reads just past a tensor.
    env "${pass_env[@]}" PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SANITIZER" "${tool_args[@]}" --error-exitcode 1 \
      --print-limit 50 --target-processes all "${EXTRA_ARGS[@]}" \
      "$PYTHON" -m scripts.sanitize_cases --subset "$subset" "${ONLY_ARGS[@]}" >"$log" 2>&1
    rc=$?
    seconds=$((SECONDS - start))
    result="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 2 | sed 's/^=* *//' | paste -sd ';' -)"
    cases="$(grep -E '^sanitize_cases:' "$log" | tail -n 1)"
    line="$tool ($label): exit $rc in ${seconds} s; ${result:-no sanitizer summary}"
    line+="; ${cases:-the case driver did not finish}"
    summary+=("$line")
    echo "sanitize: $line"
    if [[ $rc -ne 0 ]]; then
      status=1
      echo "sanitize: first findings of $tool (full log: $log):"
      grep -E '^========= ' "$log" | grep -vE 'SUMMARY|COMPUTE-SANITIZER' | head -n 40
      grep -E '^(Traceback|AssertionError|RuntimeError)|Error:' "$log" | head -n 10
    fi
  done
done

echo "sanitize: summary"
printf '  %s\n' "${summary[@]}"
if [[ $status -ne 0 ]]; then
  echo "sanitize: FAILED (logs in $LOG_DIR)"
else
  echo "sanitize: clean"
fi
exit $status
