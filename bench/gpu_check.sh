#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and no network (the device tool's H200): builds with CMake,
# runs the CUDA tests (pytest-xdist where installed, so a test that kills its process is named and the
# run goes on), each section's edge cases under compute-sanitizer memcheck and racecheck in separate
# processes, the timings against the peers with a per-kernel table, and end-to-end decoding on the GPU.
# Every step has a deadline, and the whole check one too (GPU_CHECK_SECONDS, default 540: under the
# device tool's 10 minutes a command), so the summary is always printed: a step that no longer fits
# is recorded as skipped. About 4 minutes after the build on an H200. Writes at most 8 files under
# $OUT (default build/gpu_check):
#   gpu_check.log build.log ptxas.txt tests.log sanitize.log timings.jsonl decode.log
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-$PWD/build/gpu_check}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XKERNELS_CUDA=1 XKERNELS_PTXAS_VERBOSE=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0a}"
export MAX_JOBS="${MAX_JOBS:-16}"
SECTIONS="chain refine tree spiffy"
declare -a SUMMARY=()
record() { SUMMARY+=("$(printf '%-34s %s' "$1" "$2")"); }
verdict() { case $1 in 0) echo ok;; 124|137) echo "TIMED OUT";; *) echo "FAILED (exit $1)";; esac; }
summary() {
  echo; echo "== summary ($(date +%T))"
  printf '%s\n' "${SUMMARY[@]}"
}
trap summary EXIT
step() { echo; echo "== $1 ($(date +%T))"; }
DEADLINE=$(( SECONDS + ${GPU_CHECK_SECONDS:-540} ))
# limit SECONDS: the step's own limit, cut to what is left of the check's (minus 10 s for the summary).
limit() { local left=$(( DEADLINE - SECONDS - 10 )); echo $(( $1 < left ? $1 : left )); }
# fits NAME SECONDS: whether a step may start (at least 20 s left); if not, records it as skipped.
fits() { if [ "$(limit "$2")" -ge 20 ]; then return 0; fi; record "$1" "skipped: the check's deadline"; return 1; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

step "build"
timeout "$(limit 420)" python -c 'import setup, sysconfig; setup.build_with_cmake("xkernels/libxkernels" + sysconfig.get_config_var("EXT_SUFFIX"))' \
  > "$OUT/build.log" 2>&1
rc=$?; record build "$(verdict $rc)"
if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit 1; fi
grep -E "ptxas info +: (Used|Compiling entry)|spill" "$OUT/build.log" | (c++filt 2>/dev/null || cat) > "$OUT/ptxas.txt"
grep -E "libstdc\+\+" "$OUT/build.log" | sed 's/^ *-- //'
python -m xkernels info

step "tests (CUDA ones and the argument errors) beside the sanitizers"
XDIST=""
python -c 'import xdist' 2>/dev/null && XDIST="-n 8"
TESTS_LIMIT=$(limit 150)
timeout "$TESTS_LIMIT" python -m pytest tests -q -rf -p no:cacheprovider $XDIST -m needs_cuda > "$OUT/tests.log" 2>&1 &
tests_pid=$!
: > "$OUT/sanitize.log"
declare -A SAN_PIDS=()
for tool in memcheck racecheck; do
  for section in $SECTIONS; do
    ( out=$(timeout "$TESTS_LIMIT" compute-sanitizer --tool $tool --error-exitcode 9 python bench/gpu_bench.py --sanitize $section 2>&1)
      rc=$?; { echo "-- $tool $section: exit $rc"; echo "$out" | tail -25; } >> "$OUT/sanitize.log"; exit $rc ) &
    SAN_PIDS["$tool $section"]=$!
  done
done
wait $tests_pid; rc=$?
tail -25 "$OUT/tests.log"
record "pytest -m needs_cuda" "$(verdict $rc): $(grep -E '(passed|failed|error)' "$OUT/tests.log" | tail -1)"
if fits "argument errors (CPU + CUDA)" 60; then
  timeout "$(limit 60)" python -m pytest tests/test_error_messages.py -q -p no:cacheprovider >> "$OUT/tests.log" 2>&1
  record "argument errors (CPU + CUDA)" "$(verdict $?)"
fi
for key in "${!SAN_PIDS[@]}"; do
  wait "${SAN_PIDS[$key]}"; record "sanitizer $key" "$(verdict $?)"
done
grep -E "^-- |ERROR SUMMARY|Invalid|Race" "$OUT/sanitize.log" | head -60

step "timings against the peers, with the kernels of each case"
for section in $SECTIONS; do
  fits "timings $section" 120 || continue
  timeout "$(limit 120)" python bench/gpu_bench.py --only $section --profile --json "$OUT/timings.jsonl"
  record "timings $section" "$(verdict $?)"
done

step "end to end on the GPU: every mode against ar, and the generate_batch sweep (held-out prompts, T=0)"
if fits "demo --device cuda" 150; then
  timeout "$(limit 150)" python -m xkernels demo --device cuda --prompts 2 --tokens 64 --no-sweep --no-diffusion \
    --max-passes 1 --batch-sizes 1,4,16,64 --out /tmp/xk_demo > "$OUT/decode.log" 2>&1
  record "demo --device cuda" "$(verdict $?)"
  tail -60 "$OUT/decode.log"
fi

failed=$(printf '%s\n' "${SUMMARY[@]}" | grep -cv ' ok')
exit $(( failed > 0 ))
