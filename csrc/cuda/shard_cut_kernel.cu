// shard_cut_histogram and shard_cut_pick on CUDA. The histogram: blocks of a row each take a strided share of its 16-byte chunks, key,
// weigh and count the candidates into a shared histogram (shard_cut.h), then add it into the row's
// histogram in global memory. The sums are integers, so the atomics' order does not change them. The
// pick: a thread a row (256 buckets in sequence; rows are few). One launch each, no host reads.
#include "device_utils.cuh"
#include "row_reduce.cuh"
#include "shard_cut_launch.h"
#include "xkernels/shard_cut.h"

namespace xkernels::cuda {
namespace {

using Sum = unsigned long long;  // atomicAdd's 64-bit integer

template <typename T>
__global__ void __launch_bounds__(kThreads) shard_cut_histogram_kernel(ShardCutHistogramParams p) {
  __shared__ Sum hist[2 * kCutBuckets];  // hi parts, then lo parts
  for (int i = threadIdx.x; i < 2 * kCutBuckets; i += blockDim.x) hist[i] = 0;
  __syncthreads();
  const int64_t r = blockIdx.x;
  const T* row = static_cast<const T*>(p.logits) + r * p.v;
  const float scale = p.scale[r];
  const auto prefix = static_cast<uint64_t>(p.prefix[r]);
  const CutWeights w{p.row_max != nullptr, p.row_max ? p.row_max[r] : 0.0f, p.keep_value != nullptr,
                     FilterCut{p.keep_value ? p.keep_value[r] : 0.0f, p.keep_id ? p.keep_id[r] : 0}};
  const auto observe = [&](float a, int64_t x) {
    const auto id = static_cast<int32_t>(p.vocab_start + x);
    const uint64_t key = cut_rank_key(a, id);
    if (!cut_candidate(key, prefix, p.shift)) return;
    const CutWeight cw = cut_weight(w, a, id, w.mass ? exp_f32(a - w.row_max) : 0.0f);
    const int d = cut_digit(key, p.shift);
    if (cw.hi != 0) atomicAdd(&hist[d], static_cast<Sum>(cw.hi));
    if (cw.lo != 0) atomicAdd(&hist[kCutBuckets + d], static_cast<Sum>(cw.lo));
  };
  // row_reduce.cuh's read: the row's blocks take its 16-byte chunks in turn, 4 in flight a thread,
  // where the row starts 16-byte aligned (else, and in a row's last partial chunk, id by id).
  constexpr int kIds = 16 / sizeof(T);
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
  for_each_row_value<T, 4>(
      row, p.v, 0, (p.v + kIds - 1) / kIds, vector_ok, scale, p.ignore_id - p.vocab_start,
      static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x, static_cast<int64_t>(gridDim.y) * blockDim.x,
      [&](const float (&a)[kIds], int32_t x) {
#pragma unroll
        for (int j = 0; j < kIds; ++j) observe(a[j], x + j);
      },
      [&](float a, int32_t x) { observe(a, x); });
  __syncthreads();
  auto* out = reinterpret_cast<Sum*>(p.out) + r * 2 * kCutBuckets;
  for (int i = threadIdx.x; i < 2 * kCutBuckets; i += blockDim.x) {
    if (hist[i] != 0) atomicAdd(&out[i], hist[i]);
  }
}

__global__ void __launch_bounds__(kThreads) shard_cut_pick_kernel(ShardCutPickParams p) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= p.r) return;
  const int64_t* hi = p.hist + r * p.parts * kCutBuckets;
  const int bucket = cut_pick(hi, p.parts == 2 ? hi + kCutBuckets : nullptr, p.before[2 * r], p.before[2 * r + 1],
                              p.target[r]);
  p.prefix[r] = static_cast<int64_t>(static_cast<uint64_t>(p.prefix[r]) * kCutBuckets + static_cast<uint64_t>(bucket));
}

template <typename T>
cudaError_t launch_typed(const ShardCutHistogramParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.r), static_cast<unsigned>(shard_cut_blocks_per_row(p.r, p.v)));
  shard_cut_histogram_kernel<T><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

int64_t shard_cut_blocks_per_row(int64_t r, int64_t v) {
  constexpr int64_t kMinIds = 8 * kThreads, kChipBlocks = 4 * 132;  // a few waves of an H200's SMs
  const int64_t by_ids = (v + kMinIds - 1) / kMinIds;
  const int64_t by_chip = (kChipBlocks + r - 1) / (r > 0 ? r : 1);
  const int64_t blocks = by_ids < by_chip ? by_ids : by_chip;
  return blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks);
}

cudaError_t launch_shard_cut_histogram(const ShardCutHistogramParams& p, cudaStream_t stream) {
  if (p.r == 0 || p.v == 0) return cudaSuccess;  // the zero-filled histograms stand
  if (p.r > 0x7FFFFFFF) return cudaErrorInvalidValue;
  switch (p.dtype) {
    case LogitsType::kFloat32: return launch_typed<float>(p, stream);
    case LogitsType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
    case LogitsType::kFloat16: return launch_typed<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_shard_cut_pick(const ShardCutPickParams& p, cudaStream_t stream) {
  if (p.r == 0) return cudaSuccess;
  const int64_t blocks = (p.r + kThreads - 1) / kThreads;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  shard_cut_pick_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace xkernels::cuda
