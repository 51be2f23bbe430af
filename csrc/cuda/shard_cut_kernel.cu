// shard_cut_histogram, shard_cut_pick and shard_cut_candidates on CUDA. The histogram: blocks of a row each take a strided share of its
// 16-byte chunks, key, weigh and count the candidates into a shared histogram (shard_cut.h), then
// add it into the row's histogram in global memory. The sums are integers, so the atomics' order
// does not change them. The pick: a thread a row (256 buckets in sequence; rows are few). The
// candidates: a block a row, a radix select of its count-th key in shared memory, one gather and a
// bitonic sort. One launch each, no host reads.
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

using Key = unsigned long long;

// Row blockIdx.x's count lowest keys: rounds of 8 bits, each a pass counting the candidates' digits
// in shared memory, until the bucket holding the count-th key holds no key past it (every key of
// it kept: about 2-4 rounds for distinct values); then a pass gathers the kept keys (at most count)
// and the block sorts them.
template <typename T>
__global__ void __launch_bounds__(kThreads) shard_cut_candidates_kernel(ShardCutCandidatesParams p) {
  __shared__ Key keys[kCutCandidatesMax];
  __shared__ unsigned hist[kCutBuckets];
  __shared__ unsigned kept;
  const int64_t r = blockIdx.x;
  const T* row = static_cast<const T*>(p.logits) + r * p.v;
  const float scale = p.scale[r];
  const auto count = static_cast<unsigned>(p.count);
  constexpr int kIds = 16 / sizeof(T);
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
  // Each key of an id above -inf (NaNs never), to f, in one pass over the row.
  const auto each_key = [&](auto&& f) {
    const auto take = [&](float a, int32_t x) {
      if (a > kNegInf) f(cut_rank_key(a, static_cast<int32_t>(p.vocab_start + x)));
    };
    for_each_row_value<T, 4>(
        row, p.v, 0, (p.v + kIds - 1) / kIds, vector_ok, scale, p.ignore_id - p.vocab_start, threadIdx.x, blockDim.x,
        [&](const float (&a)[kIds], int32_t x) {
#pragma unroll
          for (int j = 0; j < kIds; ++j) take(a[j], x + j);
        },
        take);
  };
  Key prefix = 0, limit = ~Key{0};  // limit: the largest key kept (every key where fewer than count)
  unsigned before = 0;              // the keys ranked before prefix's
  for (int shift = kCutTopShift; shift >= 0; shift -= kCutDigitBits) {
    for (int i = threadIdx.x; i < kCutBuckets; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    each_key([&](Key key) {
      if (cut_candidate(key, prefix, shift)) atomicAdd(&hist[cut_digit(key, shift)], 1u);
    });
    __syncthreads();
    int bucket = -1;  // every thread scans the same counts
    unsigned through = before;
    for (int b = 0; b < kCutBuckets && bucket < 0; ++b) {
      through += hist[b];
      if (through >= count) bucket = b;
      else before = through;
    }
    __syncthreads();  // counts read before the next round clears them
    if (bucket < 0) break;  // fewer than count keys: all kept
    prefix = prefix * kCutBuckets + static_cast<Key>(bucket);
    if (through == count || shift == 0) {  // the bucket's keys are all kept
      limit = (prefix << shift) | ((Key{1} << shift) - 1);
      break;
    }
  }
  if (threadIdx.x == 0) kept = 0;
  __syncthreads();
  each_key([&](Key key) {
    if (key > limit) return;
    const unsigned slot = atomicAdd(&kept, 1u);
    if (slot < count) keys[slot] = key;  // the limit keeps at most count keys
  });
  __syncthreads();
  const int n = static_cast<int>(kept < count ? kept : count);
  int n2 = 1;
  while (n2 < n) n2 <<= 1;
  for (int i = n + threadIdx.x; i < n2; i += blockDim.x) keys[i] = ~Key{0};
  __syncthreads();
  block_bitonic_sort(
      n2, [&](int j, int i) { return keys[j] < keys[i]; },
      [&](int i, int j) {
        const Key k = keys[i];
        keys[i] = keys[j];
        keys[j] = k;
      });
  const CutWeights w{p.row_max != nullptr, p.row_max ? p.row_max[r] : 0.0f, false, FilterCut{}};
  for (int j = threadIdx.x; j < static_cast<int>(count); j += blockDim.x) {
    const Key key = j < n ? keys[j] : kCutKeepAllKey;
    p.keys[r * count + j] = static_cast<int64_t>(key);
    if (w.mass && j < n) {
      const float a = cut_key_value(key);
      const CutWeight cw = cut_weight(w, a, 0, exp_f32(a - w.row_max));
      p.weights[2 * (r * count + j)] = cw.hi;
      p.weights[2 * (r * count + j) + 1] = cw.lo;
    }
  }
}

template <typename T>
cudaError_t launch_typed(const ShardCutHistogramParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.r), static_cast<unsigned>(shard_cut_blocks_per_row(p.r, p.v)));
  shard_cut_histogram_kernel<T><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_candidates_typed(const ShardCutCandidatesParams& p, cudaStream_t stream) {
  shard_cut_candidates_kernel<T><<<static_cast<unsigned>(p.r), kThreads, 0, stream>>>(p);
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

cudaError_t launch_shard_cut_candidates(const ShardCutCandidatesParams& p, cudaStream_t stream) {
  if (p.r == 0 || p.count == 0) return cudaSuccess;
  if (p.r > 0x7FFFFFFF || p.count < 0 || p.count > kCutCandidatesMax) return cudaErrorInvalidValue;
  switch (p.dtype) {
    case LogitsType::kFloat32: return launch_candidates_typed<float>(p, stream);
    case LogitsType::kBFloat16: return launch_candidates_typed<__nv_bfloat16>(p, stream);
    case LogitsType::kFloat16: return launch_candidates_typed<__half>(p, stream);
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
