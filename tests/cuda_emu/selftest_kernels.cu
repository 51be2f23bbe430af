// Kernels that break (or keep) the CUDA rules the emulation checks, for test_emulation.py.
// Built only into the emulation library (tests/cuda_emu/build.sh), never into xkernels.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;

// Correct: a block sum through shuffles, dynamic shared memory and a barrier.
__global__ void block_sum(const float* x, float* out, int n) {
  extern __shared__ float partial[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float v = threadIdx.x < n ? x[threadIdx.x] : 0.0f;
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(kFull, v, d);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) s += partial[w];
    out[blockIdx.x] = s;
  }
}

__global__ void shuffle_with_exited_lane(float* out) {
  if (threadIdx.x % 32 == 3) return;
  out[threadIdx.x] = __shfl_xor_sync(kFull, 1.0f, 1);
}

__global__ void barrier_after_exit(float* out) {
  if (threadIdx.x == 40) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void mask_without_caller(float* out) { out[threadIdx.x] = __shfl_sync(0x1u, 1.0f, 0); }

__global__ void different_collectives(float* out) {
  if (threadIdx.x % 2)
    out[threadIdx.x] = static_cast<float>(__ballot_sync(kFull, 1));
  else
    out[threadIdx.x] = __shfl_xor_sync(kFull, 1.0f, 1);
}

__global__ void barrier_against_shuffle(float* out) {
  if (threadIdx.x < 16)
    __syncthreads();
  else
    out[threadIdx.x] = __shfl_xor_sync(kFull, 1.0f, 1);
}

__global__ void reads_lane_outside_mask(float* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000FFFFu, 1.0f, 20);
}

__global__ void big_dynamic_smem(float* out) {
  extern __shared__ float big[];
  big[threadIdx.x] = 1.0f;
  out[threadIdx.x] = big[threadIdx.x];
}

__global__ void read_past_end(const float* x, float* out, int n) { out[0] = x[n]; }

__global__ void noop(float*) {}

}  // namespace

// Runs case `which`; returns the cudaError_t of the launches, or -1 with the violation in msg.
extern "C" int xk_emu_selftest(int which, float* result, char* msg, size_t len) {
  float in[64], out[256] = {};
  for (int i = 0; i < 64; ++i) in[i] = static_cast<float>(i);
  switch (which) {
    case 0: block_sum<<<2, 64, 2 * sizeof(float)>>>(in, out, 64); break;
    case 1: shuffle_with_exited_lane<<<1, 32>>>(out); break;
    case 2: barrier_after_exit<<<1, 64>>>(out); break;
    case 3: mask_without_caller<<<1, 32>>>(out); break;
    case 4: different_collectives<<<1, 32>>>(out); break;
    case 5: barrier_against_shuffle<<<1, 32>>>(out); break;
    case 6: reads_lane_outside_mask<<<1, 32>>>(out); break;
    case 7: big_dynamic_smem<<<1, 32, 64 * 1024>>>(out); break;
    case 8:
      cudaFuncSetAttribute(big_dynamic_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
      big_dynamic_smem<<<1, 32, 64 * 1024>>>(out);
      break;
    case 9: noop<<<0, 32>>>(out); break;
    case 10: noop<<<1, 2048>>>(out); break;
    case 11: {
      float* exact = new float[8]();
      read_past_end<<<1, 1>>>(exact, out, 8);
      delete[] exact;
      break;
    }
  }
  const std::string v = xk_emu::take_violation();
  const cudaError_t err = cudaGetLastError();
  std::snprintf(msg, len, "%s", v.c_str());
  if (result) *result = out[0];
  return v.empty() ? static_cast<int>(err) : -1;
}
