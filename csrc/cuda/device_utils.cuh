// Device helpers shared by the CUDA kernels: element loads, warp and block merges
// of the shared reduction states (xkernels/sampling.h), device-side RNG arguments.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "xkernels/sampling.h"

namespace xkernels::cuda {

// A workspace region's bytes rounded up to 256, so that the region after it starts aligned.
inline size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(kFullMask, x, d);
  return x;
}

__device__ __forceinline__ ArgMax shfl_argmax(ArgMax a, int delta) {
  return ArgMax{__shfl_xor_sync(kFullMask, a.val, delta), __shfl_xor_sync(kFullMask, a.idx, delta)};
}

__device__ __forceinline__ RowStats warp_merge(RowStats s) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const RowStats o{shfl_argmax(s.top, d), __shfl_xor_sync(kFullMask, s.sum, d)};
    s = stats_merge(s, o);
  }
  return s;
}

__device__ __forceinline__ ArgMax warp_merge(ArgMax a) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) a = argmax_merge(a, shfl_argmax(a, d));
  return a;
}

// Merges the states of each aligned group of kWidth lanes (every lane of the warp takes part).
template <int kWidth = 32>
__device__ __forceinline__ SampledRow warp_merge(SampledRow s) {
  static_assert(kWidth >= 1 && kWidth <= 32 && (kWidth & (kWidth - 1)) == 0, "a power of two lanes");
#pragma unroll
  for (int d = kWidth / 2; d > 0; d >>= 1) {
    SampledRow o;
    o.pick = shfl_argmax(s.pick, d);
    o.pick_a = __shfl_xor_sync(kFullMask, s.pick_a, d);
    o.stats = RowStats{shfl_argmax(s.stats.top, d), __shfl_xor_sync(kFullMask, s.stats.sum, d)};
    s = sampled_merge(s, o);
  }
  return s;
}

// Reduces one value per thread to thread 0 of the block (of kBlockThreads threads, at most 1024).
// A __syncthreads must separate two calls (the second would overwrite warp_results while warp 0
// reads them).
template <int kBlockThreads = kThreads, typename S>
__device__ __forceinline__ S block_merge(S s, S empty) {
  constexpr int kBlockWarps = kBlockThreads / 32;
  __shared__ S warp_results[kBlockWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  s = warp_merge(s);
  if (lane == 0) warp_results[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < kBlockWarps ? warp_results[lane] : empty;
    s = warp_merge(s);
  }
  return s;
}

// The block's sum of one float per thread, at thread 0 (of a block of kBlockThreads threads). Like
// block_merge it reuses a shared buffer: a __syncthreads must separate two calls.
template <int kBlockThreads = kThreads>
__device__ __forceinline__ float block_sum(float x) {
  constexpr int kBlockWarps = kBlockThreads / 32;
  __shared__ float warp_sums[kBlockWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  x = warp_sum(x);
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) x = warp_sum(lane < kBlockWarps ? warp_sums[lane] : 0.0f);
  return x;
}

// Sorts n2 (a power of two) entries held in shared memory, by the block: first(j, i) says whether
// entry j goes before entry i, swap(i, j) exchanges them. A bitonic network, a __syncthreads a step.
template <typename First, typename Swap>
__device__ __forceinline__ void block_bitonic_sort(int n2, const First& first, const Swap& swap) {
  for (int size = 2; size <= n2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n2; i += static_cast<int>(blockDim.x)) {
        const int j = i ^ stride;
        if (j > i && ((i & size) == 0) == first(j, i)) swap(i, j);
      }
      __syncthreads();
    }
  }
}

__device__ __forceinline__ uint64_t read_or(const int64_t* ptr, uint64_t fallback) {
  return ptr ? static_cast<uint64_t>(*ptr) : fallback;
}

}  // namespace xkernels::cuda
