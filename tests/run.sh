#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the whole test suite:
# the Python tests (CUDA ones skip without a GPU) and the C++ API program of tests/cpp.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$XK_ROOT"
XKERNELS_CPP_TEST="$(XK_PY="$XK_PY" bash tests/cpp/build_and_run.sh)"
export XKERNELS_CPP_TEST
export LD_LIBRARY_PATH="$(ls -d "$("$XK_PY" -c 'import pathlib, torch; print(pathlib.Path(torch.__file__).resolve().parent.parent)')"/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}"
# Test paths given first (tests/test_x.py, a folder, a node id) replace the whole folder.
XK_TEST_PATHS=(tests)
if [ "$#" -gt 0 ] && [[ "$1" != -* ]]; then XK_TEST_PATHS=(); fi
"$XK_PY" -m pytest "${XK_TEST_PATHS[@]}" "$@"
