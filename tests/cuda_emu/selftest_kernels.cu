// Kernels that break (or keep) the CUDA rules the emulation checks, for test_emulation.py.
// Built only into the emulation library (tests/cuda_emu/build.sh), never into xkernels.
#include <cooperative_groups.h>
#include <cuda_pipeline_primitives.h>
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

// Correct: the blocks of a cluster meet at cluster.sync (run one after another they would never
// meet); each keeps its own static shared memory. out[b] = b + 1 + 10 * (the other block's b + 1).
__global__ void cluster_exchange(float* staged, float* out) {
  __shared__ float mine;
  const auto cluster = cooperative_groups::this_cluster();
  if (threadIdx.x == 0) mine = static_cast<float>(blockIdx.x + 1), staged[blockIdx.x] = mine;
  cluster.sync();
  if (threadIdx.x == 0) {
    const unsigned other = blockIdx.x - cluster.block_rank() + (cluster.block_rank() + 1) % cluster.num_blocks();
    out[blockIdx.x] = mine + 10.0f * staged[other];
  }
}

__global__ void cluster_sync_after_exit(float* out) {
  if (cooperative_groups::this_cluster().block_rank() == 1 && threadIdx.x == 5) return;
  cooperative_groups::this_cluster().sync();
  out[threadIdx.x] = 1.0f;
}

__global__ void cluster_sync_against_syncthreads(float*) {
  if (threadIdx.x < 32)
    cooperative_groups::this_cluster().sync();
  else
    __syncthreads();
}

__global__ void cluster_sync_against_shuffle(float* out) {
  if (cooperative_groups::this_cluster().block_rank() == 1 && threadIdx.x < 16)
    out[threadIdx.x] = __shfl_xor_sync(kFull, 1.0f, 1);
  else
    cooperative_groups::this_cluster().sync();
}

__global__ void cluster_noop(float* out) {
  cooperative_groups::this_cluster().sync();
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<float>(cooperative_groups::this_cluster().num_blocks());
}

// Two groups of asynchronous copies into shared memory (ids 0..3, then 4..7 of x): a wait for all
// but the newest group lands the first only; the second's destination still holds what was there.
__global__ void async_copy_groups(const float* x, float* out) {
  extern __shared__ __align__(16) float staged_copies[];
  staged_copies[4] = -1.0f;
  __pipeline_memcpy_async(staged_copies, x, 16);
  __pipeline_commit();
  __pipeline_memcpy_async(staged_copies + 4, x + 4, 16);
  __pipeline_commit();
  __pipeline_wait_prior(1);
  const float first = staged_copies[0] + staged_copies[1] + staged_copies[2] + staged_copies[3];
  const float before = staged_copies[4];
  __pipeline_wait_prior(0);
  out[0] = first + staged_copies[4] + staged_copies[5] + staged_copies[6] + staged_copies[7] + (before == -1.0f ? 0 : 1000);
}

__global__ void async_copy_misaligned(const float* x, float*) {
  extern __shared__ __align__(16) float staged_copies[];
  __pipeline_memcpy_async(staged_copies, x + 1, 16);
}

__global__ void async_copy_to_global(const float* x, float* out) { __pipeline_memcpy_async(out, x, 16); }

// A launch of `kernel` on `blocks` blocks of `threads` in clusters of `cluster` (x).
template <typename... P, typename... A>
cudaError_t launch_clusters(void (*kernel)(P...), unsigned blocks, unsigned threads, unsigned cluster, A... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks), config.blockDim = dim3(threads), config.attrs = &attr, config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace

// Runs case `which`; returns the cudaError_t of the launches, or -1 with the violation in msg.
extern "C" int xk_emu_selftest(int which, float* result, char* msg, size_t len) {
  alignas(16) float in[64];
  alignas(16) float out[256] = {};
  float staged[64] = {};
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
    case 12:
      launch_clusters(cluster_exchange, 4, 64, 2, staged, out);
      out[0] += out[1] + out[2] + out[3];  // 21 + 12 + 43 + 34
      break;
    case 13: launch_clusters(cluster_sync_after_exit, 4, 64, 2, out); break;
    case 14: launch_clusters(cluster_sync_against_syncthreads, 2, 64, 2, out); break;
    case 15: launch_clusters(cluster_sync_against_shuffle, 2, 32, 2, out); break;
    case 16: launch_clusters(cluster_noop, 3, 32, 2, out); break;
    case 17: launch_clusters(cluster_noop, 16, 32, 16, out); break;
    case 18:
      cudaFuncSetAttribute(cluster_noop, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      launch_clusters(cluster_noop, 32, 32, 16, out);
      break;
    case 19: noop<<<1, 32>>>(out); launch_clusters(cluster_noop, 32, 32, 32, out); break;
    case 20: launch_clusters(cluster_noop, 2, 32, 0, out); break;
    case 21: async_copy_groups<<<1, 1, 8 * sizeof(float)>>>(in, out); break;
    case 22: async_copy_misaligned<<<1, 1, 8 * sizeof(float)>>>(in, out); break;
    case 23: async_copy_to_global<<<1, 1>>>(in, out); break;
  }
  const std::string v = xk_emu::take_violation();
  const cudaError_t err = cudaGetLastError();
  std::snprintf(msg, len, "%s", v.c_str());
  if (result) *result = out[0];
  return v.empty() ? static_cast<int>(err) : -1;
}
