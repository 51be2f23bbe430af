#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and no network (the device tool's H200):
# builds with CMake, runs the whole test suite (CUDA tests included), runs the ops under
# compute-sanitizer, and times them. Writes everything under $OUT (or build/gpu_check).
# Budget: about 5 minutes on an H200, and up to 7 more for the end-to-end demo and batch bench.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-$PWD/build/gpu_check}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XKERNELS_CUDA=1 XKERNELS_PTXAS_VERBOSE=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0a}"
export MAX_JOBS="${MAX_JOBS:-16}"
status=0
step() { echo; echo "== $1 ($(date +%T))"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

step "build"
python -c 'import setup, sysconfig; setup.build_with_cmake("xkernels/libxkernels" + sysconfig.get_config_var("EXT_SUFFIX"))' \
  > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
grep -E "ptxas info +: (Used|Compiling entry)|spill" "$OUT/build.log" | (c++filt 2>/dev/null || cat) > "$OUT/ptxas.txt"
python -m xkernels info

step "tests"
timeout 300 python -m pytest tests -q -x -p no:cacheprovider || status=1

step "compute-sanitizer (memcheck, racecheck)"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python bench/gpu_bench.py --sanitize || status=1
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 python bench/gpu_bench.py --sanitize || status=1

step "timings"
timeout 180 python bench/gpu_bench.py --json "$OUT/timings.json" || status=1

step "end to end: the demo on the GPU with the generate_batch sweep (issue 17's targets)"
timeout 300 python -m xkernels demo --device cuda --prompts 2 --tokens 64 --no-sweep --no-diffusion --max-passes 1 \
  --batch-sizes 1,4,16,64 --out "$OUT/demo" || status=1
timeout 120 python bench/bench_generate_batch.py --device cuda --rounds 2 --modes ar jacobi tree || status=1

step "done: status $status"
exit $status
