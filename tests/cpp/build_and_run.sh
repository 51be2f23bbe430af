# Installs the CMake build of xkernels (made by `pip install -e .`) under build/install, builds
# this C++ user of it with find_package(XKernels), runs it, and prints the program's path last.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${XK_PY:-python3}"
cmake --install "$ROOT/build/cmake" --prefix "$ROOT/build/install" >/dev/null
TORCH_CMAKE="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
NVIDIA="$("$PY" -c 'import pathlib, torch; print(pathlib.Path(torch.__file__).resolve().parent.parent / "nvidia")')"
args=(-DCMAKE_PREFIX_PATH="$ROOT/build/install;$TORCH_CMAKE")
if [ "$("$PY" -c 'import torch; print(torch.version.cuda is not None)')" = True ]; then
  # torch's CMake config looks for the CUDA toolkit even for a CPU-only program.
  CUDA_HOME="${CUDA_HOME:-$(nvcc --dryrun -c -x cu /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)}"
  CUDA_HOME="$(cd "$CUDA_HOME" && pwd)"
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0a}"  # else torch try_runs a GPU probe
  args+=(-DCUDAToolkit_ROOT="$CUDA_HOME" -DCUDA_TOOLKIT_ROOT_DIR="$CUDA_HOME")
  nvrtc=$(ls "$NVIDIA"/*/lib/libnvrtc.so* 2>/dev/null | head -1 || true)
  [ -n "$nvrtc" ] && args+=(-DCUDA_nvrtc_LIBRARY="$nvrtc")
  export LD_LIBRARY_PATH="$(ls -d "$NVIDIA"/*/lib | tr '\n' ':')${LD_LIBRARY_PATH:-}"
fi
cmake -S "$ROOT/tests/cpp" -B "$ROOT/build/cpp" "${args[@]}" >/dev/null
cmake --build "$ROOT/build/cpp" -j "${MAX_JOBS:-2}" >/dev/null
"$ROOT/build/cpp/xkernels_cpp_test" >&2
echo "$ROOT/build/cpp/xkernels_cpp_test"
