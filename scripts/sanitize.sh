#!/usr/bin/env bash
# Runs the sanitizer case matrix (scripts/sanitize_cases.py) under NVIDIA compute-sanitizer: memcheck over every
# case, racecheck and synccheck over one small case per kernel variant. GPU only (not part of CI).
#
#   bash scripts/sanitize.sh                       # all three tools
#   bash scripts/sanitize.sh memcheck              # one tool (memcheck, racecheck, synccheck, initcheck)
#   SANITIZE_ONLY=page16 bash scripts/sanitize.sh  # only cases whose name contains "page16"
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
status=0
summary=()
for tool in "${TOOLS[@]}"; do
  case "$tool" in
    memcheck) subset=all ;;
    racecheck | synccheck | initcheck) subset=kernels ;;
    *)
      echo "sanitize: unknown tool '$tool' (memcheck, racecheck, synccheck, initcheck)" >&2
      exit 2
      ;;
  esac
  tool_args=(--tool "$tool")
  # racecheck: print the analysed hazards (one line per race, not per access).
  [[ "$tool" == racecheck ]] && tool_args+=(--racecheck-report analysis)
  log="$LOG_DIR/$tool.log"
  start=$SECONDS
  # Without the caching allocator every tensor is its own allocation, so memcheck sees reads just past a tensor.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SANITIZER" "${tool_args[@]}" --error-exitcode 1 --print-limit 50 \
    --target-processes all "${EXTRA_ARGS[@]}" \
    "$PYTHON" scripts/sanitize_cases.py --subset "$subset" "${ONLY_ARGS[@]}" >"$log" 2>&1
  rc=$?
  seconds=$((SECONDS - start))
  result="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 2 | sed 's/^=* *//' | paste -sd ';' -)"
  cases="$(grep -E '^sanitize_cases:' "$log" | tail -n 1)"
  line="$tool ($subset): exit $rc in ${seconds} s; ${result:-no sanitizer summary}; ${cases:-the case driver did not finish}"
  summary+=("$line")
  echo "sanitize: $line"
  if [[ $rc -ne 0 ]]; then
    status=1
    echo "sanitize: first findings of $tool (full log: $log):"
    grep -E '^========= ' "$log" | grep -vE 'SUMMARY|COMPUTE-SANITIZER' | head -n 40
    grep -E '^(Traceback|AssertionError|RuntimeError)|Error:' "$log" | head -n 10
  fi
done

echo "sanitize: summary"
printf '  %s\n' "${summary[@]}"
if [[ $status -ne 0 ]]; then
  echo "sanitize: FAILED (logs in $LOG_DIR)"
else
  echo "sanitize: clean"
fi
exit $status
