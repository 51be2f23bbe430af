#!/usr/bin/env bash
# Builds the CUDA emulation library: every csrc/cuda/*.cu (and the emulation's own test kernels:
# selftest_kernels.cu, row_cut_kernel.cu), translated (translate.py, with
# the .cuh headers they include) and compiled
# by the host compiler against cuda_emu.h, with AddressSanitizer and UndefinedBehaviorSanitizer.
# Prints the library's path. Needs only python3 and a C++20 compiler (no torch, no nvcc).
# Incremental: an object is rebuilt only when its translated source or a header it includes
# (the compiler's dependency file) changed. XK_EMU_BUILD picks the folder (default build/cuda_emu),
# so that several checkouts or sessions on one machine do not share objects.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
EMU="$ROOT/tests/cuda_emu"
OUT="${XK_EMU_BUILD:-$ROOT/build/cuda_emu}"
mkdir -p "$OUT"
CXX="${CXX:-g++}"
FLAGS=(-std=c++20 ${XK_EMU_OPT:--O1} -g -fPIC -fno-omit-frame-pointer ${XK_EMU_SAN--fsanitize=address,undefined,float-cast-overflow}
       -fno-sanitize-recover=all -Wall -Wno-unknown-pragmas -Wno-sign-compare -Werror=return-type
       -I"$EMU/include" -I"$EMU" -I"$ROOT/csrc/include" -I"$ROOT/csrc/cuda" -include "$EMU/cuda_emu.h")
# The kernels' headers are translated too (their static shared memory), next to the translated
# sources, where the sources' quoted includes find them first.
for h in "$ROOT"/csrc/cuda/*.cuh; do
  python3 "$EMU/translate.py" "$h" "$OUT/$(basename "$h").new"
  cmp -s "$OUT/$(basename "$h").new" "$OUT/$(basename "$h")" && rm "$OUT/$(basename "$h").new" || mv "$OUT/$(basename "$h").new" "$OUT/$(basename "$h")"
done
objs=()
stale() {  # object: missing, or older than a file its dependency file names (flags in the stamp)
  [ -f "$1" ] && [ -f "$1.d" ] && [ "$(cat "$1.flags" 2>/dev/null)" = "$CXX ${FLAGS[*]}" ] || return 0
  local dep
  for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$1.d"); do
    # a folder copied from another names that one's translations: this folder's are the ones compiled
    case "$dep" in "$OUT"/* | "$ROOT"/csrc/* | "$EMU"/* | /usr/*) ;; *.cpp | *.cuh) dep="$OUT/$(basename "$dep")" ;; esac
    [ "$dep" -nt "$1" ] && return 0
  done
  return 1
}
compile() {  # source, object
  stale "$2" || return 0
  "$CXX" "${FLAGS[@]}" -MMD -MF "$2.d" -c "$1" -o "$2" && echo "$CXX ${FLAGS[*]}" > "$2.flags"
}
pids=()
for cu in "$ROOT"/csrc/cuda/*.cu "$EMU"/selftest_kernels.cu "$EMU"/row_cut_kernel.cu; do
  name="$(basename "${cu%.cu}")"
  # The translation is rewritten only when it changes, so its time stamp says what changed.
  python3 "$EMU/translate.py" "$cu" "$OUT/$name.cpp.new"
  cmp -s "$OUT/$name.cpp.new" "$OUT/$name.cpp" && rm "$OUT/$name.cpp.new" || mv "$OUT/$name.cpp.new" "$OUT/$name.cpp"
  compile "$OUT/$name.cpp" "$OUT/$name.o" & pids+=($!)
  objs+=("$OUT/$name.o")
done
compile "$EMU/cuda_emu.cpp" "$OUT/cuda_emu.o" & pids+=($!)
compile "$EMU/shim.cpp" "$OUT/shim.o" & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done
"$CXX" -shared -fsanitize=address,undefined "${objs[@]}" "$OUT/cuda_emu.o" "$OUT/shim.o" -o "$OUT/libxk_cuda_emu.so"
echo "$OUT/libxk_cuda_emu.so"
