#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and no network (the device tool's H200), sized for one
# window of 15 minutes: about 2 for the machine's start, and the whole check, build included, under
# GPU_CHECK_SECONDS (default 570: one device command's 600 s limit, less 30 s). Every step
# has its own limit, cut to what is left, so the summary (each step's seconds of its limit and its
# verdict, to plan the next window from) is always printed, and a step that no longer fits is
# recorded as skipped. The steps, most needed first (a step's limit, then what it took on the H200):
#   machine, build  CMake; ptxas's registers and spills to ptxas.txt (150 s; 159 s on 2026-12-04)
#   tests           the CUDA tests (pytest -m needs_cuda, the argument errors on CUDA among them;
#                   -v and a JUnit file, so a killed run still names its tests) (90 s; 69 s)
#   sanitizers      each section's edge cases (bench/gpu_bench.py --sanitize) under compute-sanitizer
#                   memcheck and racecheck, after the tests, one process each, in parallel; only
#                   xkernels' kernels instrumented, no caching allocator under memcheck; racecheck
#                   gets the cases sized for it (--racecheck: no cuBLAS GEMM) (90 s)
#   timings         tree, spiffy, dllm, refine, chain, ragged, shard (the redesigned kernels first)
#                   against eager PyTorch and cuBLAS, with each case's kernels (60 s a section)
#   profile         Nsight Compute over one call of each timing case (gpu_bench.py --profile-once):
#                   per xkernels kernel its duration, DRAM and SM throughput, occupancy, registers,
#                   shared memory and top warp stalls, to ncu.csv and a table (bench/ncu_table.py);
#                   skipped, with the reason, where ncu is absent or cannot read the counters (90 s)
#   compile peers   torch.compile and CuPy at one case a section (chain T=1 with q, refine N=8),
#                   each compile bounded at 45 s, a case over it recorded as skipped (120 s)
#   decode          end to end on the GPU, measured before (60 s)
# --dry-run runs every step's flow on the CPU in seconds (no GPU, no build, no compute-sanitizer, no
# ncu: the table of a fixture CSV; CPU tensors at tiny shapes): tests/test_gpu_check.py runs it in
# CI, so that a script error shows there and not in a GPU window. PYTHON picks the interpreter
# (default python3). Writes under $OUT (default build/gpu_check): gpu_check.log build.log ptxas.txt
# tests.log tests.xml sanitize.log timings.jsonl profile.log ncu.csv profile.txt peers.jsonl decode.log.
# The device tool brings back at most 8 files from its own $OUT: there, run it as
#   D=$OUT; OUT=/tmp/gpu_check bash bench/gpu_check.sh; tar -C /tmp/gpu_check -czf "$D/gpu_check.tgz" .
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
NCU_TABLE=("$PYTHON" bench/ncu_table.py)
TEST_PATHS=(tests)
DEMO=("$PYTHON" -m xkernels demo --device cuda --prompts 2 --tokens 64 --batch-sizes 1,4,16,64)
if [ $DRY = 1 ]; then
  # The same steps, all sections in one process a step (an interpreter start costs seconds of CPU).
  BATCHES=("$SECTIONS")
  BENCH+=(--dry-run)
  TEST_PATHS=(tests/test_error_messages.py)  # its CUDA cases skip on the CPU
  # The demo's command line parsed, not run (tests/test_demo.py runs the demo).
  DEMO=("$PYTHON" -c 'import sys, xkernels.__main__ as m; m.demo = lambda a: print("dry run: demo", vars(a))
m.main(sys.argv[1:])' demo --device cpu --prompts 1 --tokens 4 --batch-sizes 1)
  export OMP_NUM_THREADS=1  # processes side by side on a few cores: no thread oversubscribes them
fi
declare -a SUMMARY=()
# record NAME SECONDS VERDICT [LIMIT]
record() { SUMMARY+=("$(printf '%-30s %4ss of %4s  %s' "$1" "$2" "${4:+${4}s}" "$3")"); }
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
BUDGET=${GPU_CHECK_SECONDS:-570}
DEADLINE=$((SECONDS + BUDGET))
# limit SECONDS: the step's own limit, cut to what is left of the check's, less timeout's 10 s
# grace before its kill and 5 s for the summary.
limit() { local left=$((DEADLINE - SECONDS - 15)); echo $(($1 < left ? $1 : left)); }
# timed SECONDS LOG CMD...: CMD under `limit SECONDS` (in LIMIT), its output appended to LOG (- :
# the console), its seconds in TOOK; not run, status 254, when under 15 s are left for it.
timed() {
  local t0 log=$2
  LIMIT=$(limit "$1") TOOK=0
  shift 2
  [ "$LIMIT" -lt 15 ] && return 254
  t0=$SECONDS
  if [ "$log" = - ]; then timeout -k 10 "$LIMIT" "$@"; else timeout -k 10 "$LIMIT" "$@" >> "$log" 2>&1; fi
  local rc=$?
  TOOK=$((SECONDS - t0))
  return $rc
}
# run NAME SECONDS LOG CMD...: timed, recorded with its verdict, seconds and limit.
run() {
  local name=$1 rc
  shift
  timed "$@"
  rc=$?
  if [ $rc = 254 ]; then record "$name" 0 "skipped: the check's deadline"; return 1; fi
  record "$name" "$TOOK" "$(verdict $rc)" "$LIMIT"
  return $rc
}
# tool NAME: the CUDA tool's path (PATH, the CUDA toolkit, Nsight Compute's own folder), or nothing.
tool() {
  local found dir
  found=$(command -v "$1")
  for dir in "${CUDA_HOME:-/usr/local/cuda}/bin" /usr/local/cuda/bin /opt/nvidia/nsight-compute/*; do
    [ -z "$found" ] && [ -x "$dir/$1" ] && found="$dir/$1"
  done
  echo "$found"
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
SANITIZER=$(tool compute-sanitizer)
if [ $DRY = 0 ] && [ -z "$SANITIZER" ]; then
  record "sanitizers" 0 "skipped: no compute-sanitizer"
elif t=$(limit 90) && [ "$t" -ge 15 ]; then
  [ $DRY = 1 ] && echo "dry run: each section's cases run without compute-sanitizer"
  # The 2026-12-04 run's racecheck of refine failed inside sequential_refine's cuBLAS GEMM, with
  # --kernel-name already leaving cuBLAS's kernels uninstrumented: its cases launch no cuBLAS at all.
  echo "racecheck: bfloat16 cases, refine's with the fused read alone (no cuBLAS GEMM under racecheck:"
  echo "the --kernel-name filter did not keep it out of the 2026-12-04 failure); spiffy's cut (90 s was not enough)"
  : > "$OUT/sanitize.log"
  runs=$(mktemp -d)
  t0=$SECONDS
  declare -a KEYS=() PIDS=()
  for tool in $TOOLS; do
    for batch in "${BATCHES[@]}"; do
      SAN=() CASES=()
      [ $DRY = 0 ] && SAN=("$SANITIZER" --tool "$tool" --kernel-name kns=xkernels --error-exitcode 9)
      [ "$tool" = racecheck ] && CASES=(--racecheck)
      (
        # The caching allocator hands out pieces of its pools: an access past a tensor inside one
        # would look valid to memcheck.
        [ "$tool" = memcheck ] && export PYTORCH_NO_CUDA_MEMORY_CACHING=1
        exec timeout -k 10 "$t" "${SAN[@]}" "${BENCH[@]}" --sanitize $batch "${CASES[@]}" \
          > "$runs/$tool-${batch// /-}.log" 2>&1
      ) &
      KEYS+=("$tool $batch")
      PIDS+=($!)
    done
  done
  for i in "${!KEYS[@]}"; do
    wait "${PIDS[$i]}"
    rc=$?
    record "sanitizer ${KEYS[$i]}" $((SECONDS - t0)) "$(verdict $rc)" "$t"
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

step "profile: Nsight Compute, one launch of each xkernels kernel at the timings' shapes"
NCU=$(tool ncu)
if [ $DRY = 0 ] && [ -z "$NCU" ]; then
  record "profile" 0 "skipped: no ncu"
else
  PROFILE=()  # the dry run: the cases' one calls without ncu, then the table of a fixture CSV
  CSV=bench/ncu_table_fixture.csv
  if [ $DRY = 0 ]; then
    CSV="$OUT/ncu.csv"
    # Only the kernels between gpu_bench's cudaProfilerStart/Stop (one call a case) and of the
    # xkernels namespace; the clocks as the card has them (METHOD.md: leave its settings alone).
    PROFILE=("$NCU" --clock-control none --profile-from-start off --nvtx --kernel-name-base demangled
             --kernel-name regex:xkernels:: --launch-count 300 --metrics "$("${NCU_TABLE[@]}" --metrics)"
             --csv --page raw --print-units base --log-file "$CSV")
  fi
  # The cases stop 25 s before the step's limit: ncu writes the report of those done as the program ends.
  timed 90 "$OUT/profile.log" "${PROFILE[@]}" "${BENCH[@]}" --profile-once --profile-seconds $(($(limit 90) - 25))
  rc=$?
  # The cases ncu saw (the dry run: each named; a GPU run: their count, the table names them).
  grep "^profiled once" "$OUT/profile.log" | if [ $DRY = 1 ]; then cat; else wc -l | sed 's/$/ cases/'; fi
  grep "^left out" "$OUT/profile.log"
  if [ $rc = 254 ]; then
    record "profile" 0 "skipped: the check's deadline"
  elif "${NCU_TABLE[@]}" "$CSV" > "$OUT/profile.txt" 2>&1; then
    cat "$OUT/profile.txt"
    record "profile" "$TOOK" "$(verdict $rc)" "$LIMIT"
  else
    # ncu refuses some runtimes: ERR_NVGPUCTRPERM (no permission for the counters), or "Failed to
    # initialize the profiler" (gVisor, KINDS.md); its own lines say which.
    why=$(grep -hoE "ERR_[A-Z_]+|Failed to initialize the profiler[^.]*|==ERROR== .*" "$OUT/profile.log" "$CSV" \
          2> /dev/null | head -1)
    tail -20 "$OUT/profile.log"
    record "profile" "$TOOK" "skipped: ${why:-no kernel rows ($(verdict $rc))}" "$LIMIT"
  fi
fi

step "torch.compile and CuPy peers: one case a section, each compile bounded"
run "compile peers" 120 - "${BENCH[@]}" --only refine chain --compile-only --compile-bound 45 \
  --json "$OUT/peers.jsonl"

step "end to end: every mode against ar, and the generate_batch sweep (held-out prompts, T=0)"
run "decode" 60 "$OUT/decode.log" "${DEMO[@]}" --no-sweep --no-diffusion --max-passes 1 --out "$OUT/demo"
tail -40 "$OUT/decode.log"

failed=$(printf '%s\n' "${SUMMARY[@]}" | grep -cv ' ok$')
exit $((failed > 0))
