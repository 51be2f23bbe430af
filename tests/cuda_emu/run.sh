#!/usr/bin/env bash
# Runs the real CUDA kernels on the CPU under the emulation (cuda_emu.h), AddressSanitizer and
# UndefinedBehaviorSanitizer, against the references. Uses the test environment of tests/env.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
cd "$XK_ROOT"
XK_CUDA_EMU_LIB="$(bash tests/cuda_emu/build.sh)"
export XK_CUDA_EMU_LIB
# Test paths given first (tests/test_x.py, a folder, a node id) replace the whole folder.
XK_TEST_PATHS=(tests/cuda_emu)
if [ "$#" -gt 0 ] && [[ "$1" != -* ]]; then XK_TEST_PATHS=(); fi
ASAN_LIB="$("${CXX:-g++}" -print-file-name=libasan.so)"
# libstdc++ preloaded too: ASan intercepts __cxa_throw only if the real one is there at start, and
# python links no libstdc++ (the fuzz campaign calls the CPU ops, which throw their argument errors).
STDCXX_LIB="$("${CXX:-g++}" -print-file-name=libstdc++.so)"
# Leak checking would report the Python interpreter's own allocations; an allocation too large
# returns null (torch raises) instead of aborting.
LD_PRELOAD="$ASAN_LIB $STDCXX_LIB" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 \
  UBSAN_OPTIONS=print_stacktrace=1 \
  "$XK_PY" -m pytest "${XK_TEST_PATHS[@]}" "$@"
