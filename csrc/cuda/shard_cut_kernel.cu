// shard_cut_histogram, shard_cut_pick and shard_cut_candidates on CUDA. The histogram: blocks of a row each take a strided share of its
// 16-byte chunks, key, weigh and count the candidates into a shared histogram (shard_cut.h), then
// add it into the row's histogram in global memory. The sums are integers, so the atomics' order
// does not change them. The pick: a warp a row, a warp scan over its 256 buckets. The candidates:
// a block a row, a radix select of its count-th key in shared memory (a warp scans each round's
// counts), one gather and a bitonic sort. One launch each, no host reads.
#include "device_utils.cuh"
#include "row_reduce.cuh"
#include "shard_cut_launch.h"
#include "xkernels/shard_cut.h"

namespace xkernels::cuda {
namespace {

// A bucket's weight part in shared memory as two 32-bit words, value high 2^32 + low: a 64-bit
// shared atomicAdd is a compare-and-swap loop on sm_90 (ATOMS.CAST.SPIN.64), which the ~6 buckets
// that take nearly every id of the first round (the key's sign and exponent bits) kept retrying; a
// 32-bit add is one native ATOMS.ADD, and `high` takes an add only when `low` wraps. Exact, so any
// order gives the same sums.
struct SplitSums {
  unsigned low[2 * kCutBuckets], high[2 * kCutBuckets];  // hi parts, then lo parts

  __device__ __forceinline__ void add(int i, uint64_t w) {  // w < 2^32 (a weight part is at most 2^31)
    const auto w32 = static_cast<unsigned>(w);
    const unsigned old = atomicAdd(&low[i], w32);
    if (old > ~w32) atomicAdd(&high[i], 1u);  // low wrapped
  }
  __device__ __forceinline__ uint64_t sum(int i) const {
    return static_cast<uint64_t>(high[i]) << 32 | low[i];
  }
};

template <typename T>
__global__ void __launch_bounds__(kThreads) shard_cut_histogram_kernel(ShardCutHistogramParams p) {
  __shared__ SplitSums hist;
  for (int i = threadIdx.x; i < 2 * kCutBuckets; i += blockDim.x) hist.low[i] = hist.high[i] = 0;
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
    // A count's weight is kCutWeightOne (2^31) or 0: counted as 1 and scaled at the flush, since
    // 2^31 adds would wrap `low` every second id.
    if (cw.hi != 0) hist.add(d, w.mass ? static_cast<uint64_t>(cw.hi) : 1u);
    if (cw.lo != 0) hist.add(kCutBuckets + d, static_cast<uint64_t>(cw.lo));
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
  auto* out = reinterpret_cast<unsigned long long*>(p.out) + r * 2 * kCutBuckets;  // atomicAdd's 64-bit integer
  for (int i = threadIdx.x; i < 2 * kCutBuckets; i += blockDim.x) {
    const uint64_t sum = hist.sum(i) * (w.mass ? 1u : static_cast<uint64_t>(kCutWeightOne));  // a count's lo is 0
    if (sum != 0) atomicAdd(&out[i], static_cast<unsigned long long>(sum));
  }
}

constexpr int kLaneBuckets = kCutBuckets / 32;  // a warp scans 256 buckets, 8 consecutive a lane

// x summed over lanes 0 .. this lane. Unsigned sums wrap, so they are exact in any grouping.
template <typename U>
__device__ __forceinline__ U warp_inclusive_sum(U x) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const U y = __shfl_up_sync(kFullMask, x, d);
    if (lane >= d) x += y;
  }
  return x;
}

__device__ __forceinline__ int warp_count(int x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(kFullMask, x, d);
  return x;
}

// A warp a row (a thread a row made 256 dependent steps of strided 8-byte loads): lane l loads
// buckets 8l .. 8l+7, all at once, and a warp scan gives each bucket's cumulative weight. The sums
// wrap as cut_pick's do (xkernels/shard_cut.h), so the bucket and `before` are its bit for bit.
__global__ void __launch_bounds__(kThreads) shard_cut_pick_kernel(ShardCutPickParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= p.r) return;  // the whole warp
  const int64_t* hi = p.hist + r * p.parts * kCutBuckets + kLaneBuckets * lane;
  const int64_t* lo = p.parts == 2 ? hi + kCutBuckets : nullptr;
  uint64_t h[kLaneBuckets], l[kLaneBuckets];  // this lane's buckets, cumulative
#pragma unroll
  for (int u = 0; u < kLaneBuckets; ++u) {
    h[u] = static_cast<uint64_t>(hi[u]);
    l[u] = lo ? static_cast<uint64_t>(lo[u]) : 0;
  }
#pragma unroll
  for (int u = 1; u < kLaneBuckets; ++u) h[u] += h[u - 1], l[u] += l[u - 1];
  // The weight ranked before this lane's first bucket.
  const uint64_t h0 = static_cast<uint64_t>(p.before[2 * r]) + warp_inclusive_sum(h[kLaneBuckets - 1]) -
                      h[kLaneBuckets - 1];
  const uint64_t l0 = static_cast<uint64_t>(p.before[2 * r + 1]) + warp_inclusive_sum(l[kLaneBuckets - 1]) -
                      l[kLaneBuckets - 1];
  const double target = p.target[r];
  int below = 0;
#pragma unroll
  for (int u = 0; u < kLaneBuckets; ++u)
    below += cut_weight_value(static_cast<int64_t>(h0 + h[u]), static_cast<int64_t>(l0 + l[u]), lo != nullptr) <
             target;
  below = warp_count(below);
  const int bucket = below < kCutBuckets - 1 ? below : kCutBuckets - 1;
  if (lane != bucket / kLaneBuckets) return;
  // before becomes the weight ranked before the bucket: through its lane's previous bucket.
  const int at = bucket % kLaneBuckets;
  uint64_t bh = h0, bl = l0;
#pragma unroll
  for (int u = 0; u + 1 < kLaneBuckets; ++u)
    if (u + 1 == at) bh = h0 + h[u], bl = l0 + l[u];  // a select: no run-time index into h
  p.before[2 * r] = static_cast<int64_t>(bh);
  p.before[2 * r + 1] = static_cast<int64_t>(bl);  // without lo, before_lo + 0: unchanged
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
  struct Pick {
    int bucket;  // -1: fewer than count keys
    unsigned before, through;  // the keys ranked before the bucket, and through it
  };
  __shared__ Pick pick;
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
    if (threadIdx.x < 32) {  // warp 0 finds the first bucket whose cumulative count reaches count
      const int lane = threadIdx.x;
      unsigned c[kLaneBuckets];  // cumulative over this lane's buckets
#pragma unroll
      for (int u = 0; u < kLaneBuckets; ++u) c[u] = hist[kLaneBuckets * lane + u] + (u > 0 ? c[u - 1] : 0u);
      const unsigned c0 = before + warp_inclusive_sum(c[kLaneBuckets - 1]) - c[kLaneBuckets - 1];
      int below = 0;  // the counts only grow: the buckets below count precede the first to reach it
#pragma unroll
      for (int u = 0; u < kLaneBuckets; ++u) below += c0 + c[u] < count;
      below = warp_count(below);
      if (below == kCutBuckets) {
        if (lane == 0) pick.bucket = -1;
      } else if (lane == below / kLaneBuckets) {
        const int at = below % kLaneBuckets;
        unsigned b = c0, t = c0 + c[0];
#pragma unroll
        for (int u = 1; u < kLaneBuckets; ++u)
          if (u == at) b = c0 + c[u - 1], t = c0 + c[u];
        pick = Pick{below, b, t};
      }
    }
    __syncthreads();
    const int bucket = pick.bucket;
    const unsigned through = pick.through;
    if (bucket >= 0) before = pick.before;
    __syncthreads();  // pick read before the next round writes it
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
  const int64_t blocks = (p.r + kWarps - 1) / kWarps;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  shard_cut_pick_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace xkernels::cuda
