// dllm_step's rule on one masked row (xkernels/dllm.h), read whole by a group of threads (a block in
// spiffy_accept). dllm_step splits the same rule over slices of the row (dllm_kernel.cu): same
// statistics, same Gumbel noise, same ties, so both ops pick the same tokens.
#pragma once

#include <cstdint>

#include "device_utils.cuh"
#include "launch_types.h"
#include "xkernels/sampling_params.h"
#include "row_filter.cuh"
#include "row_reduce.cuh"
#include "xkernels/dllm.h"

namespace xkernels::cuda {

// Slices of the masked rows of dllm_step and of spiffy_materialize's first pass: a slice of at
// least about kMaskedSliceBytes, so that each thread makes about 4 rounds of its 4 loads of 16 B in
// flight (16 KB a round for 256 threads) after its block's test of block[row], a load the row's
// loads wait on: with the 17 slices of row_slice_count's default at 16 x 32 rows of 126464 ids,
// each thread made about one round, so nothing hid that latency. Issuing the row's loads before
// the test instead would read the unmasked rows too: in a block's last steps most of its rows.
constexpr int64_t kMaskedSliceBytes = 64 * 1024;

inline int masked_row_slices(int64_t rows, int64_t v, int num_sms, LogitsType dtype) {
  return row_slice_count(rows, v, num_sms, 8, kMaskedSliceBytes / (dtype == LogitsType::kFloat32 ? 4 : 2));
}

// Whether a row's cut drops anything (keep_all() is {-inf, ...}).
__device__ __forceinline__ bool cut_active(const FilterCut& cut) { return cut.val > kNegInf; }

// Gumbel-max of the tempered row (plain sampling over the ids `cut` keeps, the mask token never
// drawn) over groups [g_begin, g_end) of 4 ids, groups g_begin + first, + stride, ... by this
// thread (vector loads of 4 ids, 4 in flight, when vector_ok), into best.
template <typename T>
__device__ __forceinline__ void dllm_draw(const T* src, int64_t v, int64_t mask, float inv_t, const FilterCut& cut,
                                          uint64_t seed, uint64_t offset, uint32_t sequence, uint32_t position,
                                          bool vector_ok, int64_t g_begin, int64_t g_end, int64_t first,
                                          int64_t stride, ArgMax& best) {
  const SampleJob job{kSamplePlain, static_cast<int32_t>(position), -1, 0, stats_empty()};  // no stats read
  const bool filtered = cut_active(cut);
  const auto observe = [&](int64_t g, float (&a)[4], int count) {
    if (static_cast<uint64_t>(mask - 4 * g) < 4) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (4 * g + j == mask) a[j] = kNegInf;
    }
    if (filtered) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (!filter_keeps(cut, a[j], static_cast<int32_t>(4 * g + j))) a[j] = kNegInf;
    }
    sample_group(best, job, seed, offset, sequence, static_cast<uint32_t>(g), a, nullptr, count);
  };
  const int64_t vector_end = vector_ok ? vector_span_end(g_begin, g_end, v / 4) : g_begin;
  using Q = typename Quad<T>::type;
  for_each_batched<4>(
      g_begin + first, vector_end, stride, [&](int64_t g) { return reinterpret_cast<const Q*>(src)[g]; },
      [&](int64_t g, const Q& x) {
        float a[4];
        unpack<T>(x, inv_t, a);
        observe(g, a, 4);
      });
  for (int64_t g = vector_end + first; g < g_end; g += stride) {
    float a[4];
    const int count = v - 4 * g < 4 ? static_cast<int>(v - 4 * g) : 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = j < count ? to_float(src[4 * g + j]) * inv_t : kNegInf;
    observe(g, a, count);
  }
}

struct DllmPick {
  int32_t token;
  float confidence;
};

// The Gumbel-max draw over the ids above a cut's bin, taken in the cut's own gather pass
// (row_filter.cuh's hook): with those of the ranked candidates it kept, the draw over the cut row.
struct GumbelHook {
  static constexpr bool kActive = true;
  uint64_t seed, offset;
  uint32_t sequence, position;
  float floor;  // min-p's (+inf without): above_floor is the draw over the ids at or above it
  ArgMax best, above_floor;
  __device__ __forceinline__ void begin() { best = above_floor = argmax_empty(); }
  __device__ __forceinline__ void observe(int64_t i, float a) {
    const ArgMax s = gumbel_score(a, static_cast<int32_t>(i), seed, offset, sequence, position);
    best = argmax_merge(best, s);
    if (a >= floor) above_floor = argmax_merge(above_floor, s);
  }
};

// dllm_row_pick's pick of a row whose sequence may filter (a block of kThreads threads reads it;
// every thread gets the pick; `sh` the cut's shared memory): the same token (Gumbel-max over the
// ids the row's cut keeps, the same noise), the cut found on the row. A filtered row takes two
// reads: one for the raw statistics, which also notes the tempered row's top key bits for the cut,
// and the cut's gather, which also draws over the ids above the cut's bin (the candidates it ranks
// draw after it; where min-p moves the cut to a higher bin, the draw over the ids above its floor).
// Where the cut takes more passes than that (a second radix level), and in rows without a filter, a
// draw pass follows; T = 0 takes the first.
// kDepth: 16-byte loads a thread keeps in flight in the statistics pass (16, dllm_row_pick's: 64 KB
// for the one block an SM; 8 where the caller's own registers leave no room for 16).
template <int kDepth, typename T>
__device__ DllmPick dllm_filtered_pick(CutShared& sh, const T* src, int64_t v, int64_t mask, const RowSampling& rs,
                                       int mass_shift, uint64_t seed, uint64_t offset, uint32_t sequence,
                                       uint32_t position, bool vector_ok) {
  constexpr int kIds = 16 / sizeof(T);
  const int64_t chunks = (v + kIds - 1) / kIds;
  const float inv_t = rs.inv_t;
  const TopBits bits = inv_t == 0.0f ? TopBits::kNone : top_bits(rs, v);
  if (bits != TopBits::kNone) clear_top_bits(sh);
  __syncthreads();
  XK_ROW_PASS();
  const RowStats raw = block_merge_all(
      thread_row_stats<T, false, kDepth>(src, v, 0, chunks, vector_ok, 1.0f, mask, threadIdx.x, kThreads,
                                         [&](float a) { observe_top_bits(sh, a * inv_t, bits); }),
      stats_empty());
  __syncthreads();  // the top bits are complete
  const auto confidence = [&](int32_t pick) { return dllm_confidence(raw, dllm_logit(to_float(src[pick]), pick, mask)); };
  if (inv_t == 0.0f) return DllmPick{raw.top.idx, confidence(raw.top.idx)};
  // The tempered row's top: rounding is monotone, so the largest a * inv_t is the largest a's.
  const float top = raw.top.val * inv_t;
  ArgMax best = argmax_empty();
  if (is_finite_f32(top)) {
    FilterCut cut = keep_all();
    bool drawn = false;
    if (filters_active(rs, v)) {
      const RowView<T> r{src, v, inv_t, mask};
      GumbelHook hook{seed, offset, sequence, position, min_p_floor(top, rs.min_p), argmax_empty(), argmax_empty()};
      unsigned long long kept;  // the draw needs no sum
      cut = filter_cut(sh, r, top, rs, mass_shift, &kept, hook);
      const int n = sh.hooked_n;
      const uint32_t bin = sh.hooked_bin;
      drawn = n >= 0 && hook_holds_cut(cut, bin, rs.min_p > 0.0f);
      if (drawn) {
        if (bin != kAllRanked) best = hook_floor_draw(cut, bin) ? hook.above_floor : hook.best;
        for (int j = threadIdx.x; j < n; j += kThreads) {
          const float a = key_value(sh.cand.key[j]);
          const int32_t id = sh.cand.id[j];
          if (filter_keeps(cut, a, id)) best = argmax_merge(best, gumbel_score(a, id, seed, offset, sequence, position));
        }
      }
    }
    if (!drawn) {
      // Every thread starts from the exact score of the raw argmax where the cut keeps it (its
      // tempered value is top), so that gumbel_group skips most ids' logs (see gumbel_score).
      if (filter_keeps(cut, top, raw.top.idx)) best = gumbel_score(top, raw.top.idx, seed, offset, sequence, position);
      XK_ROW_PASS();
      dllm_draw(src, v, mask, inv_t, cut, seed, offset, sequence, position, vector_ok, 0, (v + 3) / 4, threadIdx.x,
                kThreads, best);
    }
    __syncthreads();  // the candidates are read before block_merge_all's buffer, and a next row, reuse sh
    best = block_merge_all(best, argmax_empty());
  }
  int32_t pick = best.idx;
  if (!is_finite_f32(top) || best.val == kNegInf) {  // no softmax, or nothing drawable: the tempered argmax
    XK_ROW_PASS();
    pick = block_merge_all(thread_row_stats<T, true, kDepth>(src, v, 0, chunks, vector_ok, inv_t, mask, threadIdx.x, kThreads),
                           stats_empty())
               .top.idx;
  }
  return DllmPick{pick, confidence(pick)};
}

// The threads first, first + stride, ... of a group read the row `src` (merge(state, empty) merges
// a state over the group and returns it to every thread of it); every thread gets the pick: the
// argmax of the raw row at T = 0, else Gumbel-max over the tempered row with the noise of
// (sequence, position) over the ids `cut` keeps (the row's argmax among them), and its confidence
// softmax(raw)[pick]. The mask token never counts.
// vector_ok: src starts 16-byte aligned.
template <typename T, typename Merge>
__device__ __forceinline__ DllmPick dllm_row_pick(const T* src, int64_t v, int64_t mask, float inv_t,
                                                  const FilterCut& cut, uint64_t seed, uint64_t offset,
                                                  uint32_t sequence, uint32_t position, bool vector_ok, int64_t first,
                                                  int64_t stride, Merge merge) {
  constexpr int kIds = 16 / sizeof(T);
  // 16 loads of 16 bytes in flight a thread: a block of 256 keeps 64 KB in flight, what one SM needs
  // for its share of HBM bandwidth.
  constexpr int kDepth = 16;
  const int64_t chunks = (v + kIds - 1) / kIds;
  const auto logit = [&](int64_t x) { return dllm_logit(to_float(src[x]), x, mask); };
  const RowStats raw =
      merge(thread_row_stats<T, false, kDepth>(src, v, 0, chunks, vector_ok, 1.0f, mask, first, stride), stats_empty());
  int32_t pick = raw.top.idx;
  if (inv_t != 0.0f) {
    // The tempered row's argmax: its point mass when degenerate; plain sampling needs no sum. At
    // T = 1 it is the raw row's (x * 1 is x), with no second read.
    const RowStats st =
        inv_t == 1.0f ? raw
                      : merge(thread_row_stats<T, true, kDepth>(src, v, 0, chunks, vector_ok, inv_t, mask, first, stride),
                              stats_empty());
    pick = st.top.idx;
    if (!stats_degenerate(st)) {
      // Each thread starts from the score of the tempered argmax (one Philox draw; see gumbel_score).
      ArgMax best = gumbel_score(logit(pick) * inv_t, pick, seed, offset, sequence, position);
      dllm_draw(src, v, mask, inv_t, cut, seed, offset, sequence, position, vector_ok, 0, (v + 3) / 4, first, stride,
                best);
      best = merge(best, argmax_empty());
      pick = best.val == kNegInf ? st.top.idx : best.idx;  // nothing drawable: the argmax
    }
  }
  return DllmPick{pick, dllm_confidence(raw, logit(pick))};
}

}  // namespace xkernels::cuda
