// Reading logit rows near the memory floor, shared by the row-reading kernels (chain_verify,
// tree_verify, dllm_step, spiffy): 16-byte loads with several in flight a thread (a thread that
// waits on one load at a time leaves an SM far below its share of HBM bandwidth), and a reduction
// of few instructions an element: a chunk's max first, the index only when it wins, and at T > 0
// one exp2 an element against the running max.
#pragma once

#include <cstdint>

#include "device_utils.cuh"
#include "xkernels/sampling.h"

namespace xkernels::cuda {

// Four ids of T in one load (the Gumbel-max groups of the Philox stream are four ids).
template <typename T>
struct Quad {
  using type = uint2;
};
template <>
struct Quad<float> {
  using type = float4;
};

// max that returns NaN if either input is NaN (torch.argmax ranks NaN first).
__device__ __forceinline__ float max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return is_nan_f32(a) ? a : is_nan_f32(b) ? b : a > b ? a : b;
#endif
}

// Merges one state per thread of the block and hands the result to every thread.
template <typename S>
__device__ __forceinline__ S block_merge_all(S s, S empty) {
  __shared__ S result;
  s = block_merge(s, empty);
  if (threadIdx.x == 0) result = s;
  __syncthreads();
  s = result;
  __syncthreads();  // result and block_merge's buffer are reused by the next call
  return s;
}

// Where the vector loads of chunks [begin, end) of a row stop: at its last whole chunk (`whole`
// of them), never before begin (an empty slice, begin > end, must read nothing).
__host__ __device__ __forceinline__ int64_t vector_span_end(int64_t begin, int64_t end, int64_t whole) {
  const int64_t e = whole < end ? whole : end;
  return e > begin ? e : begin;
}

// For the items c = first, first + stride, ... below end: x = load(c), then f(c, x), in that order
// of c, with up to `depth` (<= kDepth, at run time) loads in flight: the loads of a round of depth
// items are issued before the first f, and each f is followed at once by the load of the same slot
// of the next round, so the memory pipe never drains between rounds (a thread that issued a round,
// consumed it and only then issued the next waited out a full latency every round, with nothing in
// flight while f ran). The f calls, and so any reduction they do, keep the order of c.
template <int kDepth, typename Load, typename F>
__device__ __forceinline__ void for_each_batched(int64_t first, int64_t end, int64_t stride, int depth, Load&& load,
                                                 F&& f) {
  static_assert(kDepth <= 32, "one bit a load");
  const int64_t round = depth * stride;
  // Which slots of the round at c0 exist, as bits: the 64-bit indices are not kept live in
  // registers between the loads and their uses (they cost two registers a load in flight).
  const auto live_at = [&](int64_t c0) {
    uint32_t live = 0;
#pragma unroll
    for (int u = 0; u < kDepth; ++u) live |= static_cast<uint32_t>(u < depth && c0 + u * stride < end) << u;
    return live;
  };
  decltype(load(first)) x[kDepth];
  uint32_t live = live_at(first);
#pragma unroll
  for (int u = 0; u < kDepth; ++u)
    if (live >> u & 1u) x[u] = load(first + u * stride);
  // live is 0 past the end (slot 0 is the round's first item), and at once when depth < 1.
  for (int64_t c0 = first; live != 0; c0 += round) {
    const uint32_t next = live_at(c0 + round);  // a subset of live: slot u's item of the next round is further on
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      if (live >> u & 1u) {
        f(c0 + u * stride, x[u]);
        if (next >> u & 1u) x[u] = load(c0 + round + u * stride);
      }
    }
    live = next;
  }
}

// The same with kDepth loads a round.
template <int kDepth, typename Load, typename F>
__device__ __forceinline__ void for_each_batched(int64_t first, int64_t end, int64_t stride, Load&& load, F&& f) {
  for_each_batched<kDepth>(first, end, stride, kDepth, load, f);
}

// The elements of a loaded vector of T as floats, times scale.
template <typename T, typename V, int kIds = sizeof(V) / sizeof(T)>
__device__ __forceinline__ void unpack(const V& x, float scale, float (&out)[kIds]) {
  const T* e = reinterpret_cast<const T*>(&x);
#pragma unroll
  for (int j = 0; j < kIds; ++j) out[j] = to_float(e[j]) * scale;
}

// Adds ids first_id .. first_id + kIds - 1 (values a) to s, where every id s has seen is lower:
// then the chunk's max replaces s.top only if it is strictly better (or NaN over a number), as
// torch.argmax's lowest-index rule wants, and the chunk's own index is searched only then.
template <bool kGreedy, int kIds>
__device__ __forceinline__ void observe_chunk_in_order(RowStats& s, const float (&a)[kIds], int32_t first_id) {
  float m = a[0];
#pragma unroll
  for (int j = 1; j < kIds; ++j) m = max_nan(m, a[j]);
  if (s.top.idx == kNoIndex || (!(m <= s.top.val) && !is_nan_f32(s.top.val))) {
    int32_t at = kIds - 1;
#pragma unroll
    for (int j = kIds - 1; j >= 0; --j)
      if (a[j] == m || (is_nan_f32(m) && is_nan_f32(a[j]))) at = j;
    if constexpr (!kGreedy) s.sum = rescaled_sum(s.sum, s.top.val, m);
    s.top = ArgMax{m, first_id + at};
  }
  if constexpr (!kGreedy) {
    // sum_j exp(a_j - top) as exp2(a_j log2(e) - top log2(e)): one FMA and one MUFU an element.
    const float off = s.top.val == kNegInf ? 0.0f : s.top.val * kLog2e;
    float add = 0.0f;
#pragma unroll
    for (int j = 0; j < kIds; ++j) add += exp2f(fmaf(a[j], kLog2e, -off));
    s.sum += add;
  }
}

// One thread's share of ids [kIds * begin, min(kIds * end, v)) of a row (kIds = 16 / sizeof(T)
// ids a chunk), values logit * scale, id `excluded` (if in the row) as -inf: chunks begin + first,
// + stride, ... by 16-byte loads, kDepth in flight, when vector_ok (the row starts 16-byte aligned),
// each to on_chunk(a[kIds], first id) in increasing id order; the rest (a row's last partial
// chunk, or every id of an unaligned row) to on_id(a, id).
template <typename T, int kDepth, typename OnChunk, typename OnId>
__device__ __forceinline__ void for_each_row_value(const T* row, int64_t v, int64_t begin, int64_t end, bool vector_ok,
                                                   float scale, int64_t excluded, int64_t first, int64_t stride,
                                                   OnChunk&& on_chunk, OnId&& on_id) {
  constexpr int kIds = 16 / sizeof(T);
  const int64_t vector_end = vector_ok ? vector_span_end(begin, end, v / kIds) : begin;
  const uint4* chunks = reinterpret_cast<const uint4*>(row);
  for_each_batched<kDepth>(
      begin + first, vector_end, stride, [&](int64_t c) { return chunks[c]; },
      [&](int64_t c, const uint4& x) {
        float a[kIds];
        unpack<T>(x, scale, a);
        const int64_t base = kIds * c;
        if (static_cast<uint64_t>(excluded - base) < static_cast<uint64_t>(kIds)) {
#pragma unroll
          for (int j = 0; j < kIds; ++j)
            if (base + j == excluded) a[j] = kNegInf;
        }
        on_chunk(a, static_cast<int32_t>(base));
      });
  const int64_t id_end = kIds * end < v ? kIds * end : v;
  for (int64_t x = kIds * vector_end + first; x < id_end; x += stride)
    on_id(x == excluded ? kNegInf : to_float(row[x]) * scale, static_cast<int32_t>(x));
}

struct NoObserver {
  __device__ __forceinline__ void operator()(float) const {}
};

// The softmax statistics (kGreedy: only s.top) of one thread's share of a row, as read by
// for_each_row_value; observe(a) sees each value read (tree_verify's walk notes the cut's top key
// bits in it).
template <typename T, bool kGreedy, int kDepth, typename Observe = NoObserver>
__device__ __forceinline__ RowStats thread_row_stats(const T* row, int64_t v, int64_t begin, int64_t end,
                                                     bool vector_ok, float scale, int64_t excluded, int64_t first,
                                                     int64_t stride, const Observe& observe = {}) {
  constexpr int kIds = 16 / sizeof(T);
  RowStats s = stats_empty();
  for_each_row_value<T, kDepth>(
      row, v, begin, end, vector_ok, scale, excluded, first, stride,
      [&](const float (&a)[kIds], int32_t id) {
#pragma unroll
        for (int k = 0; k < kIds; ++k) observe(a[k]);
        observe_chunk_in_order<kGreedy>(s, a, id);
      },
      [&](float a, int32_t id) {
        observe(a);
        if constexpr (kGreedy)
          argmax_observe(s.top, a, id);
        else
          stats_observe(s, a, id);
      });
  return s;
}

// A row split in `slices` slices of whole chunks of `width` ids: slice `slice` holds chunks
// [begin, end) (empty, begin >= end, when the row has fewer chunks than slices need).
struct SliceRange {
  int64_t begin, end;
};

__host__ __device__ __forceinline__ SliceRange slice_range(int64_t v, int width, int slices, int slice) {
  const int64_t groups = (v + width - 1) / width;
  const int64_t per = (groups + slices - 1) / slices;
  const int64_t begin = per * slice;
  return SliceRange{begin, begin + per < groups ? begin + per : groups};
}

constexpr int kMaxRowSlices = 32;       // a warp merges the slices of a row
constexpr int64_t kMinSliceIds = 1024;  // a shorter slice costs more to merge than to read

// Slices per row for `rows` rows of v ids on num_sms SMs that hold `resident` blocks of the
// kernel each: enough blocks for about 8 waves (the last, partial wave then costs at most an
// eighth; one wave of whole rows left a tail as long as the rest), at most kMaxRowSlices, at least
// one, about min_ids ids or more (v / ceil(v / min_ids)). resident: the kernel's occupancy where its
// launcher asks for it (chain_verify's row_stats), else 8. Any sizes (rows = 0, v = 1, num_sms = 0)
// give a valid count.
inline int row_slice_count(int64_t rows, int64_t v, int num_sms, int resident = 8, int64_t min_ids = kMinSliceIds) {
  const int64_t sms = num_sms > 0 ? num_sms : 1, per_sm = resident > 0 ? resident : 1;
  const int64_t want = rows > 0 ? (8 * per_sm * sms + rows - 1) / rows : 1;
  const int64_t most = (v + min_ids - 1) / min_ids;
  int64_t s = want < most ? want : most;
  s = s < kMaxRowSlices ? s : kMaxRowSlices;
  return static_cast<int>(s < 1 ? 1 : s);
}

// A row's `count` (<= kMaxRowSlices) slice results merged by one warp; every lane gets the merge.
template <typename S>
__device__ __forceinline__ S warp_merge_slices(const S* slices, int count, S empty) {
  const int lane = threadIdx.x % 32;
  return warp_merge(lane < count ? slices[lane] : empty);
}

// The Gumbel-max score of id x with log-weight w in the stream of (sequence, position), exactly
// as sample_group scores it, or the empty state if x cannot be drawn. A sampling pass that starts
// every thread from the score of a likely winner (the row's argmax) skips the Philox draws of every
// group whose weights are all more than kGumbelBound below it (with the logits of a trained model
// most of the row) and the logs of nearly every other id (gumbel_group's test), with the same result.
__device__ __forceinline__ ArgMax gumbel_score(float w, int32_t x, uint64_t seed, uint64_t offset, uint32_t sequence,
                                               uint32_t position) {
  if (w == kNegInf) return argmax_empty();
  const Philox4 r = philox_draw(seed, offset, sequence, position, static_cast<uint32_t>(x / 4));
  const int j = x % 4;  // a select, not an indexed (local-memory) read
  return ArgMax{w + gumbel_from_word(j == 0 ? r.w[0] : j == 1 ? r.w[1] : j == 2 ? r.w[2] : r.w[3]), x};
}

}  // namespace xkernels::cuda
