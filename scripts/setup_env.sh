# Sourced by test.sh and demo.sh: makes a fresh machine ready and (re)builds the extension when its sources
# changed. Safe to run again: nothing is installed or rebuilt twice.
PYTHON="${PYTHON:-python3}"

missing=()
for module in torch numpy pytest hypothesis setuptools; do
  "$PYTHON" -c "import $module" 2>/dev/null || missing+=("$module")
done
command -v ninja >/dev/null || "$PYTHON" -c "import ninja" 2>/dev/null || missing+=(ninja)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  "$PYTHON" -m pip install --quiet "${missing[@]}"
fi

# Rebuild only when a source, the source list (csrc/sources.txt) or the build code is newer than the built library
# (or there is none).
libraries=(mla_ext/_C*.so)
library="${libraries[0]}"
if [[ ! -e "$library" || -n "$(find csrc build_tools setup.py -newer "$library" -type f)" ]]; then
  echo "setup: building mla_ext (MAX_JOBS=${MAX_JOBS:=$(nproc)})"
  export MAX_JOBS
  "$PYTHON" -m pip install --quiet --no-build-isolation --no-deps -e .
fi
