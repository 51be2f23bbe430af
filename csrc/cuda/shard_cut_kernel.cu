// shard_cut_histogram, shard_cut_pick and shard_cut_candidates on CUDA. The histogram: blocks of a row each take a strided share of its
// 16-byte chunks, key, weigh and count the candidates into a shared histogram (shard_cut.h), then
// add it into the row's histogram in global memory. The sums are integers, so the atomics' order
// does not change them. The pick: a warp a row, a warp scan over its 256 buckets. The candidates:
// a block a row; a count up to kOnePassMaxCount in one pass over the row (each warp keeps the keys
// below its threshold by ballot and raises it when its buffer fills, then the warps' lists merge by
// rank), larger ones by a radix select of the count-th key in shared memory (a warp scans each
// round's counts), one gather and a bitonic sort. One launch each, no host reads.
#include "device_utils.cuh"
#include "row_reduce.cuh"
#include "shard_cut_launch.h"
#include "xkernels/shard_cut.h"

// A pass over a row starts: the CUDA emulation counts them (row_filter.cuh has the same default).
#ifndef XK_ROW_PASS
#define XK_ROW_PASS()
#endif

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
  // An id's bucket and weight (in: a candidate of nonzero weight). A count's weight is
  // kCutWeightOne (2^31) or 0: counted as 1 and scaled at the flush, since 2^31 adds would wrap
  // `low` every second id.
  struct Weighed {
    bool in;
    int d;
    uint64_t hi, lo;
  };
  const int64_t excluded = p.ignore_id - p.vocab_start;
  const auto weigh = [&](float a, int64_t x) {
    const auto id = static_cast<int32_t>(p.vocab_start + x);
    const uint64_t key = cut_rank_key(a, id);
    const CutWeight cw = cut_weight(w, a, id, w.mass ? exp_f32(a - w.row_max) : 0.0f);
    const bool in = cut_candidate(key, prefix, p.shift) && (cw.hi != 0 || cw.lo != 0);
    return Weighed{in, cut_digit(key, p.shift), w.mass ? static_cast<uint64_t>(cw.hi) : (cw.hi != 0 ? 1u : 0u),
                   static_cast<uint64_t>(cw.lo)};
  };
  const auto add = [&](const Weighed& e) {  // an atomic a part
    if (e.in && e.hi != 0) hist.add(e.d, e.hi);
    if (e.in && e.lo != 0) hist.add(kCutBuckets + e.d, e.lo);
  };
  // The 16-byte chunks: the row's blocks take them in turn, 4 in flight a thread, in rounds the
  // whole block makes, so that a warp counts each of its values at once: the lanes of one bucket
  // (in the first round most ids share the few buckets of the key's sign and exponent bits) are
  // counted by one atomic of their number, not one an id.
  constexpr int kIds = 16 / sizeof(T), kDepth = 4;
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
  const int64_t chunks = vector_ok ? p.v / kIds : 0;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.x;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  const uint4* chunk = reinterpret_cast<const uint4*>(row);
  const int lane = threadIdx.x % 32;
  for (int64_t c0 = first; c0 < chunks; c0 += kDepth * stride) {
    uint4 x[kDepth];
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int64_t c = c0 + u * stride + threadIdx.x;
      x[u] = c < chunks ? chunk[c] : uint4{};
    }
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int64_t c = c0 + u * stride + threadIdx.x;
      float a[kIds];
      unpack<T>(x[u], scale, a);
#pragma unroll 1
      for (int j = 0; j < kIds; ++j) {
        float value = a[0];
#pragma unroll
        for (int k = 1; k < kIds; ++k) value = k == j ? a[k] : value;  // no run-time index into a
        const int64_t id = kIds * c + j;
        const Weighed e = c < chunks && id != excluded ? weigh(value, id) : Weighed{false, 0, 0, 0};
        if (w.mass) {  // a mass: summing a bucket's lanes would take more shuffles than the atomics
          add(e);
          continue;
        }
        for (unsigned pending = __ballot_sync(kFullMask, e.in); pending != 0;) {  // a count: 1 a lane
          const int leader = __ffs(static_cast<int>(pending)) - 1;
          const int d = __shfl_sync(kFullMask, e.d, leader);
          const unsigned group = __ballot_sync(kFullMask, e.in && e.d == d);
          pending &= ~group;
          if (lane == leader) hist.add(d, __popc(group));
        }
      }
    }
  }
  // A row not 16-byte aligned, and an aligned row's last partial chunk: id by id, an atomic an id.
  for (int64_t x = kIds * chunks + first + threadIdx.x; x < p.v; x += stride)
    add(weigh(x == excluded ? kNegInf : to_float(row[x]) * scale, x));
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

// Row blockIdx.x's count lowest keys (a count above the one pass's): rounds of 8 bits, each a pass
// counting the candidates' digits in shared memory, until the bucket holding the count-th key holds
// no key past it (every key of it kept: about 2-4 rounds for distinct values); then a pass gathers
// the kept keys (at most count) and the block sorts them.
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
    XK_ROW_PASS();
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

// The one-pass candidates: a warp's buffer of keys in shared memory, and the counts it serves (a
// full buffer keeps the best count, so at least kOnePassSlots - kOnePassMaxCount appends come
// between two sorts of it).
constexpr int kOnePassSlots = 256;
constexpr int kOnePassMaxCount = kOnePassSlots / 2;
// 16-byte chunks in flight a thread: a 38 KB shard row of 16-bit logits in 2 rounds; fp32 takes 7
// (8 spilled at sm_90a's 64 registers the compiler picks here)
template <typename T>
constexpr int kOnePassDepth = sizeof(T) == 4 ? 7 : 6;

// Sorts buf[0, n) ascending by the warp (n <= kOnePassSlots), padded with ~0 keys up to a power of
// two: a bitonic network, a lane taking every 32nd pair of a step.
__device__ __forceinline__ void warp_sort_keys(Key* buf, int n) {
  const int lane = threadIdx.x % 32;
  int n2 = 2;
  while (n2 < n) n2 <<= 1;
  for (int i = n + lane; i < n2; i += 32) buf[i] = ~Key{0};
  __syncwarp();
  for (int size = 2; size <= n2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int q = lane; q < n2 / 2; q += 32) {  // pair q: i has a 0 at stride's bit, j = i + stride
        const int i = ((q & ~(stride - 1)) << 1) | (q & (stride - 1)), j = i | stride;
        const Key x = buf[i], y = buf[j];
        if ((x > y) == ((i & size) == 0)) buf[i] = y, buf[j] = x;
      }
      __syncwarp();
    }
  }
}

// A warp's share of a row: its buffer holds every key of its ids at or above `floor` with a key
// below `limit` (keys are distinct: the id is in them); a sort that drops keys keeps the best
// count, all below the new limit, so no dropped key is among the row's best count.
struct WarpKeys {
  int n = 0;
  Key limit = ~Key{0};    // the best key dropped
  float floor = kNegInf;  // no id below it is among the row's best count (limit's value, once set)
};

// Offers one key (hit: an id above -inf) to the warp's buffer; every lane of the warp calls it.
__device__ __forceinline__ void offer_key(Key* buf, WarpKeys& s, int count, Key key, bool hit) {
  const int lane = threadIdx.x % 32;
  hit = hit && key < s.limit;
  unsigned b = __ballot_sync(kFullMask, hit);
  if (b == 0) return;
  if (s.n + __popc(b) > kOnePassSlots) {  // keep the best count; the limit rises to the next
    warp_sort_keys(buf, s.n);
    s.limit = buf[count];
    s.floor = cut_key_value(s.limit);
    s.n = count;
    __syncwarp();  // buf[count] read before an append overwrites it
    hit = hit && key < s.limit;
    b = __ballot_sync(kFullMask, hit);
  }
  if (hit) buf[s.n + __popc(b & ((1u << lane) - 1u))] = key;
  s.n += __popc(b);
}

// Row blockIdx.x's count <= kOnePassMaxCount lowest keys in one pass: the warps offer the ids of
// their chunks at or above the floor (the first round's bound, then each warp's limit), then each
// warp sorts its buffer and every key among the warps' best count finds its rank in the row by
// binary searches of the other warps' lists.
template <typename T>
__global__ void __launch_bounds__(kThreads) shard_cut_candidates_one_pass_kernel(ShardCutCandidatesParams p) {
  __shared__ Key buf[kWarps][kOnePassSlots];
  __shared__ int listed[kWarps];
  __shared__ float maxima[kThreads];
  const int warp = threadIdx.x / 32;
  const int64_t r = blockIdx.x;
  const T* row = static_cast<const T*>(p.logits) + r * p.v;
  const float scale = p.scale[r];
  const auto count = static_cast<int>(p.count);
  const int64_t excluded = p.ignore_id - p.vocab_start;
  const int64_t vocab_start = p.vocab_start;
  const auto key_of = [vocab_start](float a, int64_t x) {
    return cut_rank_key(a, static_cast<int32_t>(vocab_start + x));
  };
  WarpKeys s;
  XK_ROW_PASS();
  constexpr int kIds = 16 / sizeof(T);
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
  const int64_t chunks = vector_ok ? p.v / kIds : 0;
  const uint4* chunk = reinterpret_cast<const uint4*>(row);
  static_assert(kOnePassDepth<T> * kIds <= 64, "a bit a value of a round");
  for (int64_t c0 = 0; c0 < chunks; c0 += kOnePassDepth<T> * kThreads) {  // the same rounds at every thread
    uint4 x[kOnePassDepth<T>];
#pragma unroll
    for (int u = 0; u < kOnePassDepth<T>; ++u) {
      const int64_t c = c0 + u * kThreads + threadIdx.x;
      x[u] = c < chunks ? chunk[c] : uint4{};
    }
    if (c0 == 0) {
      // The first round's thread maxima: count of them (distinct ids) lie at or above the count-th
      // largest, so no id below it is among the row's best count. Most of a row's ids are then
      // never offered, and most warps never sort a full buffer.
      float top = kNegInf;
#pragma unroll
      for (int u = 0; u < kOnePassDepth<T>; ++u) {
        const int64_t c = u * kThreads + threadIdx.x;
        float a[kIds];
        unpack<T>(x[u], scale, a);
#pragma unroll
        for (int j = 0; j < kIds; ++j)
          if (c < chunks && kIds * c + j != excluded) top = fmaxf(top, a[j]);  // NaNs aside
      }
      maxima[threadIdx.x] = top;
      __syncthreads();
      block_bitonic_sort(
          kThreads, [&](int j, int i) { return maxima[j] > maxima[i]; },
          [&](int i, int j) {
            const float t = maxima[i];
            maxima[i] = maxima[j];
            maxima[j] = t;
          });
      s.floor = maxima[count - 1];  // -inf where fewer than count threads saw a value above it
    }
    uint64_t hits = 0;  // bit kIds u + j: value j of load u is at or above the floor, its key below the limit
#pragma unroll
    for (int u = 0; u < kOnePassDepth<T>; ++u) {
      const int64_t c = c0 + u * kThreads + threadIdx.x;
      float a[kIds];
      unpack<T>(x[u], scale, a);
      float m = kNegInf;
#pragma unroll
      for (int j = 0; j < kIds; ++j) m = fmaxf(m, a[j]);  // NaNs, never kept, aside
      if (c < chunks && m > kNegInf && m >= s.floor) {  // few chunks, once the limit has risen
#pragma unroll
        for (int j = 0; j < kIds; ++j) {
          const int64_t id = kIds * c + j;
          const bool hit = a[j] > kNegInf && a[j] >= s.floor && id != excluded && key_of(a[j], id) < s.limit;
          hits |= static_cast<uint64_t>(hit) << (kIds * u + j);
        }
      }
    }
    // The hits, one a lane at a time (one copy of offer_key), each value read again (from L1 or
    // L2: few ids pass the limit after the first rounds).
    while (__any_sync(kFullMask, hits != 0)) {
      const int bit = hits != 0 ? __ffsll(static_cast<long long>(hits)) - 1 : 0;
      const int64_t x = kIds * (c0 + bit / kIds * kThreads + threadIdx.x) + bit % kIds;
      const float a = hits != 0 ? to_float(row[x]) * scale : kNegInf;
      offer_key(buf[warp], s, count, key_of(a, x), hits != 0);
      hits &= hits - 1;
    }
  }
  // An unaligned row id by id, or an aligned one's last partial chunk.
  for (int64_t b = kIds * chunks; b < p.v; b += kThreads) {
    const int64_t x = b + threadIdx.x;
    const float a = x < p.v && x != excluded ? to_float(row[x]) * scale : kNegInf;
    offer_key(buf[warp], s, count, key_of(a, x), a > kNegInf);
  }
  warp_sort_keys(buf[warp], s.n);
  if (threadIdx.x % 32 == 0) listed[warp] = s.n < count ? s.n : count;
  __syncthreads();
  const CutWeights w{p.row_max != nullptr, p.row_max ? p.row_max[r] : 0.0f, false, FilterCut{}};
  int total = 0;
  for (int o = 0; o < kWarps; ++o) total += listed[o];
  for (int q = threadIdx.x; q < kWarps * count; q += kThreads) {
    const int from = q / count, at = q % count;
    if (at >= listed[from]) continue;
    const Key key = buf[from][at];
    int rank = at;
    for (int o = 0; o < kWarps; ++o) {
      if (o == from) continue;
      int lo = 0, hi = listed[o];  // the keys of list o below key
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (buf[o][mid] < key) lo = mid + 1;
        else hi = mid;
      }
      rank += lo;
    }
    if (rank >= count) continue;
    p.keys[r * count + rank] = static_cast<int64_t>(key);
    if (w.mass) {
      const float a = cut_key_value(key);
      const CutWeight cw = cut_weight(w, a, 0, exp_f32(a - w.row_max));
      p.weights[2 * (r * count + rank)] = cw.hi;
      p.weights[2 * (r * count + rank) + 1] = cw.lo;
    }
  }
  for (int j = (total < count ? total : count) + threadIdx.x; j < count; j += kThreads)
    p.keys[r * count + j] = static_cast<int64_t>(kCutKeepAllKey);  // weights stay 0
}

template <typename T>
cudaError_t launch_typed(const ShardCutHistogramParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.r), static_cast<unsigned>(shard_cut_blocks_per_row(p.r, p.v)));
  shard_cut_histogram_kernel<T><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_candidates_typed(const ShardCutCandidatesParams& p, cudaStream_t stream) {
  if (p.count <= kOnePassMaxCount)
    shard_cut_candidates_one_pass_kernel<T><<<static_cast<unsigned>(p.r), kThreads, 0, stream>>>(p);
  else
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
