#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and no network (the device tool's H200), sized for one
# short window: the whole check, build included, runs under GPU_CHECK_SECONDS (default 360). Every
# step has its own limit, cut to what is left, so the summary (each step's verdict and seconds, to
# plan the next window from) is always printed, and a step that no longer fits is recorded as
# skipped. The steps, most needed first:
#   machine, build  CMake; ptxas's registers and spills to ptxas.txt
#   tests           the CUDA tests (pytest -m needs_cuda, the argument errors on CUDA among them;
#                   -v and a JUnit file, so a killed run still names its tests)
#   sanitizers      each section's edge cases (bench/gpu_bench.py --sanitize) under compute-sanitizer
#                   memcheck and racecheck, after the tests, one process each, in parallel; only
#                   xkernels' kernels instrumented, no caching allocator under memcheck
#   timings         tree, spiffy, dllm, refine, chain, ragged (the redesigned kernels first) against eager
#                   PyTorch and cuBLAS, with each case's kernels; no torch.compile
#   decode          end to end on the GPU
#   compile peers   torch.compile and CuPy (chain, refine): tens of seconds a case, so last
# --dry-run runs every step's flow on the CPU in seconds (no GPU, no build, no compute-sanitizer;
# CPU tensors at tiny shapes): tests/test_gpu_check.py runs it in CI, so that a script error shows
# there and not in a GPU window. PYTHON picks the interpreter (default python3). Writes under $OUT
# (default build/gpu_check): gpu_check.log build.log ptxas.txt tests.log tests.xml sanitize.log
# timings.jsonl peers.jsonl decode.log
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: bash bench/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-$PWD/build/gpu_check}"
mkdir -p "$OUT"
exec 3>&1 4>&2
exec > >(tee "$OUT/gpu_check.log") 2>&1
TEE_PID=$!
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XKERNELS_CUDA=1 XKERNELS_PTXAS_VERBOSE=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0a}"
export MAX_JOBS="${MAX_JOBS:-16}"
SECTIONS="tree spiffy dllm refine chain ragged shard"
BATCHES=($SECTIONS)  # the sections a process: one each, so that one that dies leaves the others
BENCH=("$PYTHON" bench/gpu_bench.py)
TOOLS="memcheck racecheck"
TEST_PATHS=(tests)
DEMO=("$PYTHON" -m xkernels demo --device cuda --prompts 2 --tokens 64 --batch-sizes 1,4,16,64)
if [ $DRY = 1 ]; then
  # The same steps, all sections in one process a step (an interpreter start costs seconds of CPU).
  BATCHES=("$SECTIONS")
  BENCH+=(--dry-run)
  TOOLS="memcheck"  # without compute-sanitizer the two tools' runs are the same
  TEST_PATHS=(tests/test_error_messages.py)  # its CUDA cases skip on the CPU
  # The demo's command line parsed, not run (tests/test_demo.py runs the demo).
  DEMO=("$PYTHON" -c 'import sys, xkernels.__main__ as m; m.demo = lambda a: print("dry run: demo", vars(a))
m.main(sys.argv[1:])' demo --device cpu --prompts 1 --tokens 4 --batch-sizes 1)
  export OMP_NUM_THREADS=1  # processes side by side on a few cores: no thread oversubscribes them
fi
declare -a SUMMARY=()
# record NAME SECONDS VERDICT
record() { SUMMARY+=("$(printf '%-30s %4ss  %s' "$1" "$2" "$3")"); }
verdict() { case $1 in 0) echo ok ;; 124 | 137) echo "TIMED OUT" ;; *) echo "FAILED (exit $1)" ;; esac; }
summary() {
  echo
  echo "== summary ($(date +%T); ${SECONDS}s of GPU_CHECK_SECONDS=$BUDGET$([ $DRY = 1 ] && echo '; dry run'))"
  printf '%s\n' "${SUMMARY[@]}"
  # The console gets the summary only through tee: wait for it to write everything before exiting.
  exec 1>&3 2>&4 3>&- 4>&-
  wait "$TEE_PID" 2>/dev/null || while kill -0 "$TEE_PID" 2>/dev/null; do sleep 0.1; done
}
trap summary EXIT
step() { echo; echo "== $1 ($(date +%T), ${SECONDS}s)"; }
BUDGET=${GPU_CHECK_SECONDS:-360}
DEADLINE=$((SECONDS + BUDGET))
# limit SECONDS: the step's own limit, cut to what is left of the check's, less timeout's 10 s
# grace before its kill and 5 s for the summary.
limit() { local left=$((DEADLINE - SECONDS - 15)); echo $(($1 < left ? $1 : left)); }
# run NAME SECONDS LOG CMD...: CMD under `limit SECONDS`, its output appended to LOG (- : the
# console), recorded with its verdict and time; skipped (status 1) when under 15 s are left for it.
run() {
  local name=$1 t t0 rc log=$3
  t=$(limit "$2")
  shift 3
  if [ "$t" -lt 15 ]; then record "$name" 0 "skipped: the check's deadline"; return 1; fi
  t0=$SECONDS
  if [ "$log" = - ]; then timeout -k 10 "$t" "$@"; else timeout -k 10 "$t" "$@" >> "$log" 2>&1; fi
  rc=$?
  record "$name" $((SECONDS - t0)) "$(verdict $rc)"
  return $rc
}

step "machine"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
run machine 30 - "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

step "build"
if [ $DRY = 1 ]; then
  # No build: the library is the one installed; the entry point the build step calls must exist.
  run build 60 "$OUT/build.log" "$PYTHON" -c 'import setup; assert callable(setup.build_with_cmake)'
else
  run build 150 "$OUT/build.log" "$PYTHON" -c \
    'import setup, sysconfig; setup.build_with_cmake("xkernels/libxkernels" + sysconfig.get_config_var("EXT_SUFFIX"))'
fi || { tail -40 "$OUT/build.log"; exit 1; }
grep -E "ptxas info +: (Used|Compiling entry)|spill" "$OUT/build.log" | (c++filt 2> /dev/null || cat) > "$OUT/ptxas.txt"
grep -E "libstdc\+\+" "$OUT/build.log" | sed 's/^ *-- //'
run "xkernels info" 30 - "$PYTHON" -m xkernels info

step "CUDA tests"
XDIST=()
"$PYTHON" -c 'import xdist' 2> /dev/null && XDIST=(-n 8)
run "pytest -m needs_cuda" 90 "$OUT/tests.log" "$PYTHON" -m pytest "${TEST_PATHS[@]}" -v -rf -p no:cacheprovider \
  "${XDIST[@]}" -m needs_cuda --junitxml "$OUT/tests.xml"
grep -E "(passed|failed|error|skipped)" "$OUT/tests.log" | tail -1
grep -E "FAILED|ERROR" "$OUT/tests.log" | head -20

step "sanitizers"
SANITIZER=$(command -v compute-sanitizer)
for dir in "${CUDA_HOME:-/usr/local/cuda}" /usr/local/cuda; do
  [ -z "$SANITIZER" ] && [ -x "$dir/bin/compute-sanitizer" ] && SANITIZER="$dir/bin/compute-sanitizer"
done
if [ $DRY = 0 ] && [ -z "$SANITIZER" ]; then
  record "sanitizers" 0 "skipped: no compute-sanitizer"
elif t=$(limit 90) && [ "$t" -ge 15 ]; then
  [ $DRY = 1 ] && echo "dry run: each section's cases run without compute-sanitizer"
  : > "$OUT/sanitize.log"
  runs=$(mktemp -d)
  t0=$SECONDS
  declare -a KEYS=() PIDS=()
  for tool in $TOOLS; do
    for batch in "${BATCHES[@]}"; do
      SAN=()
      [ $DRY = 0 ] && SAN=("$SANITIZER" --tool "$tool" --kernel-name kns=xkernels --error-exitcode 9)
      (
        # The caching allocator hands out pieces of its pools: an access past a tensor inside one
        # would look valid to memcheck.
        [ "$tool" = memcheck ] && export PYTORCH_NO_CUDA_MEMORY_CACHING=1
        exec timeout -k 10 "$t" "${SAN[@]}" "${BENCH[@]}" --sanitize $batch > "$runs/$tool-${batch// /-}.log" 2>&1
      ) &
      KEYS+=("$tool $batch")
      PIDS+=($!)
    done
  done
  for i in "${!KEYS[@]}"; do
    wait "${PIDS[$i]}"
    rc=$?
    record "sanitizer ${KEYS[$i]}" $((SECONDS - t0)) "$(verdict $rc)"
    { echo "-- ${KEYS[$i]}: exit $rc"; tail -25 "$runs/${KEYS[$i]// /-}.log"; } >> "$OUT/sanitize.log"
  done
  rm -rf "$runs"
  grep -E "^-- |ERROR SUMMARY|Invalid|Race|Error" "$OUT/sanitize.log" | head -60
else
  record "sanitizers" 0 "skipped: the check's deadline"
fi

step "timings against eager PyTorch and cuBLAS, with the kernels of each case"
for batch in "${BATCHES[@]}"; do
  run "timings $batch" 60 - "${BENCH[@]}" --only $batch --no-compile --profile --json "$OUT/timings.jsonl"
done

step "end to end: every mode against ar, and the generate_batch sweep (held-out prompts, T=0)"
run "decode" 60 "$OUT/decode.log" "${DEMO[@]}" --no-sweep --no-diffusion --max-passes 1 --out "$OUT/demo"
tail -40 "$OUT/decode.log"

step "torch.compile and CuPy peers"
run "compile peers" 120 - "${BENCH[@]}" --only refine chain --compile-only --json "$OUT/peers.jsonl"

failed=$(printf '%s\n' "${SUMMARY[@]}" | grep -cv ' ok$')
exit $((failed > 0))
