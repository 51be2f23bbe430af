# Sourced by tests/run.sh and bench/run.sh: makes a virtual environment with torch and the
# test tools, and builds xkernels into it (editable). Safe to source again: what is there stays.
#   XKERNELS_VENV   the environment (default: .venv in the repository)
#   XKERNELS_TORCH  the torch requirement (default: torch==2.14.1, a CUDA 13 build that also
#                   compiles the CUDA kernels on a machine without a GPU)
set -euo pipefail
XK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
XK_VENV="${XKERNELS_VENV:-$XK_ROOT/.venv}"
if [ ! -x "$XK_VENV/bin/python" ]; then
  python3 -m venv "$XK_VENV"
fi
XK_PY="$XK_VENV/bin/python"
"$XK_PY" -m pip install -q --disable-pip-version-check "${XKERNELS_TORCH:-torch==2.14.1}" numpy scipy pytest \
  pytest-benchmark setuptools wheel tokenizers safetensors tqdm matplotlib transformers
mkdir -p "$XK_ROOT/build"
# One build at a time in a checkout: two test runs started together would share build/cmake.
exec {XK_LOCK}> "$XK_ROOT/build/.install.lock"
flock "$XK_LOCK"
if ! "$XK_PY" -m pip install -v --disable-pip-version-check --no-build-isolation -e "$XK_ROOT" \
    > "$XK_ROOT/build/install.log" 2>&1; then
  tail -60 "$XK_ROOT/build/install.log"
  echo "building xkernels failed; the whole log is build/install.log" >&2
  exit 1
fi
grep -E "^ *xkernels build:" "$XK_ROOT/build/install.log" | sort -u
flock -u "$XK_LOCK"
export XK_ROOT XK_VENV XK_PY
