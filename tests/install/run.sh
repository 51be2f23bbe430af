#!/usr/bin/env bash
# The ways a user installs xkernels, each in a fresh state (CI runs this after tests/run.sh):
#  1. a CUDA build of torch on a machine without nvcc: `pip install --no-build-isolation .`
#     (not editable) falls back to the CPU kernels, says why, imports, runs the op tests from a
#     folder outside the checkout;
#  2. the C++ consumer (tests/cpp) against that installed CPU-only build, with no toolkit;
#  3. a wheel (`pip wheel`, built in the test environment with the CUDA kernels) installed into
#     that second environment: `python -m xkernels info` and the demo from outside the checkout.
# The second environment installs the same torch wheel as the first (pip reads it from its cache).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
cd "$XK_ROOT"
ENV2="$XK_ROOT/build/env-no-nvcc"
OUTSIDE="$(mktemp -d)"
trap 'rm -rf "$OUTSIDE"' EXIT
rm -rf "$ENV2" build/cmake-cpu build/install-cpu build/dist
python3 -m venv "$ENV2"
"$ENV2/bin/python" -m pip install -q --disable-pip-version-check "${XKERNELS_TORCH:-torch==2.14.1}" numpy scipy \
  pytest setuptools wheel tokenizers safetensors tqdm matplotlib

# A PATH without nvcc, and no CUDA_HOME: what most people with `pip install torch` have.
NVCC_DIR="$(dirname "$(command -v nvcc || echo /nonexistent/nvcc)")"
NO_NVCC_PATH="$(echo "$PATH" | tr ':' '\n' | grep -v -x -F "$NVCC_DIR" | paste -sd: -)"
no_nvcc() { env -u CUDA_HOME -u XKERNELS_CUDA -u TORCH_CUDA_ARCH_LIST PATH="$ENV2/bin:$NO_NVCC_PATH" "$@"; }
if no_nvcc sh -c 'command -v nvcc' >/dev/null; then echo "nvcc is still on PATH" >&2; exit 1; fi

echo "-- 1. CUDA torch, no nvcc: pip install . (not editable)"
no_nvcc XKERNELS_BUILD_DIR="$XK_ROOT/build/cmake-cpu" "$ENV2/bin/python" -m pip install -v --disable-pip-version-check \
  --no-build-isolation --no-deps "$XK_ROOT" > build/install-no-nvcc.log 2>&1 || { tail -40 build/install-no-nvcc.log; exit 1; }
grep -E "^ *xkernels build:" build/install-no-nvcc.log | sort -u
grep -qE "CUDA kernels OFF: torch .* (is a CUDA .* build but nvcc was not found|is a CPU build)" build/install-no-nvcc.log
cp -r tests "$OUTSIDE/tests"
(cd "$OUTSIDE" && no_nvcc "$ENV2/bin/python" -m xkernels info &&
  no_nvcc "$ENV2/bin/python" -c 'import xkernels, sys; assert "site-packages" in str(xkernels._LIBRARY_PATH), xkernels._LIBRARY_PATH; assert not xkernels.build_info()["cuda"]' &&
  no_nvcc "$ENV2/bin/python" -m pytest -q -p no:cacheprovider -W ignore::pytest.PytestUnknownMarkWarning \
    tests/test_chain_verify.py tests/test_refine.py)

echo "-- 2. the C++ consumer against the installed CPU-only build, no toolkit"
cmake --install build/cmake-cpu --prefix build/install-cpu > /dev/null
no_nvcc cmake -S tests/cpp -B build/cpp-cpu -DCMAKE_PREFIX_PATH="$XK_ROOT/build/install-cpu" > /dev/null
no_nvcc cmake --build build/cpp-cpu -j "${MAX_JOBS:-2}" > /dev/null
no_nvcc build/cpp-cpu/xkernels_cpp_test

echo "-- 3. a wheel with the CUDA kernels, installed into the environment without nvcc"
"$XK_PY" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w build/dist "$XK_ROOT" \
  > build/wheel.log 2>&1 || { tail -40 build/wheel.log; exit 1; }
ls build/dist
no_nvcc "$ENV2/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall build/dist/xkernels-*.whl
(cd "$OUTSIDE" && no_nvcc "$ENV2/bin/python" -m xkernels info &&
  no_nvcc "$ENV2/bin/python" -m xkernels demo --prompts 1 --tokens 16 --max-passes 2 --out "$OUTSIDE/demo" > demo.txt &&
  tail -3 demo.txt && test -s "$OUTSIDE/demo/demo.json")
echo "install checks passed"
