#!/usr/bin/env bash
# A toolchain that links libstdc++ statically into shared libraries (as g++ 13.3 on the H200 machines
# does by default), reproduced with LDFLAGS=-static-libstdc++: the CPU-only library built both ways
# of cmake/SharedLibstdcxx.cmake (auto: the shared libstdc++ wins; private: the static copy is hidden)
# must give whole argument errors, word for word with their numbers (tests/test_error_messages.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
cd "$XK_ROOT"
for mode in auto private; do
  dir="$XK_ROOT/build/static-libstdcxx-$mode"
  rm -rf "$dir" "$dir.so"
  echo "-- LDFLAGS=-static-libstdc++, XKERNELS_LIBSTDCXX=$mode"
  env LDFLAGS=-static-libstdc++ XKERNELS_LIBSTDCXX="$mode" XKERNELS_CUDA=0 XKERNELS_BUILD_DIR="$dir" \
    "$XK_PY" -c "import setup; setup.build_with_cmake('$dir.so')" > "$dir.log" 2>&1 \
    || { tail -40 "$dir.log"; exit 1; }
  grep "xkernels: .*libstdc++" "$dir.log" | sed 's/^ *-- //'
  XKERNELS_LIBRARY="$dir.so" "$XK_PY" -m pytest -q -p no:cacheprovider tests/test_error_messages.py
done
