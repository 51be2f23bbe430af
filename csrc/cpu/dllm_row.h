// One masked position's row of dllm_step's rule on the CPU (also spiffy_accept's steps): x0 (the
// argmax at T = 0, else Gumbel-max over the tempered, filtered row with the noise of the row's
// slot) and its confidence softmax(raw)[x0], the mask token excluded (dllm_logit).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "row_reduce.h"
#include "top_filter.h"
#include "xkernels/dllm.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cpu {

struct DllmRow {
  int64_t x0;
  float confidence;
};

// out = row * scale with the mask token's logit at -inf (dllm_logit); returns out's statistics.
template <typename T>
RowStats masked_scaled_row(const T* row, int64_t v, int64_t mask_id, float scale, float* out) {
  scale_row(row, v, scale, out);
  if (mask_id >= 0 && mask_id < v) out[mask_id] = kNegInf;
  return row_stats(out, v);
}

// The statistics of a row with the mask token's logit taken as -inf (dllm_logit). For float32
// rows whose best token is not the mask token the row is read in place and the mask token's term
// leaves the sum; otherwise a copy (raw, v floats) is fixed up. Returns the row the statistics are
// of, for reading the pick's logit.
template <typename T>
const float* masked_row_stats(const T* row, int64_t v, int64_t mask_id, float* raw, RowStats& stats) {
  if constexpr (std::is_same_v<T, float>) {
    stats = row_stats(row, v);
    if (mask_id < 0 || mask_id >= v) return row;
    if (stats.top.idx != mask_id) {
      // The sum holds the top's own term 1: rounding in the subtraction must not take it below (a
      // confidence above 1).
      if (!stats_degenerate(stats)) stats.sum = std::max(1.0f, stats.sum - exp_f32(row[mask_id] - stats.top.val));
      return row;
    }
  }
  stats = masked_scaled_row(row, v, mask_id, 1.0f, raw);
  return raw;
}

// A thread's buffers for dllm_row, reused across rows.
struct DllmScratch {
  explicit DllmScratch(int64_t v) : raw(static_cast<size_t>(v)), scaled(static_cast<size_t>(v)) {}
  std::vector<float> raw, scaled;
  FilterScratch filter;
};

// The pick is drawn from the row's step distribution p' (the tempered row, the mask token at -inf,
// filtered by rs: xkernels/reference/sampling.py) with the noise of slot `slot` of stream st.
template <typename T>
DllmRow dllm_row(const T* row, int64_t v, int64_t mask_id, const RowSampling& rs, const RowStream& st,
                 uint32_t slot, DllmScratch& scratch) {
  RowStats raw_stats;
  const float* stats_of = masked_row_stats(row, v, mask_id, scratch.raw.data(), raw_stats);
  int32_t pick = raw_stats.top.idx;
  if (rs.inv_t != 0.0f) {
    float* scaled = scratch.scaled.data();
    RowStats s = masked_scaled_row(row, v, mask_id, rs.inv_t, scaled);
    pick = s.top.idx;
    if (!stats_degenerate(s)) {
      if (filters_active(rs, v)) s = filter_row(scaled, v, s, rs, scratch.filter);
      const uint32_t position = st.position_at(slot);
      const SampleJob job{kSamplePlain, static_cast<int32_t>(position), -1, s.top.idx, s};
      ArgMax best = argmax_empty();
      for (int64_t g = 0; 4 * g < v; ++g)
        sample_group(best, job, st.seed, st.offset_at(slot), st.sequence_at(), static_cast<uint32_t>(g),
                     scaled + 4 * g, nullptr, static_cast<int>(std::min<int64_t>(4, v - 4 * g)));
      pick = sample_result(job, best);
    }
  }
  return DllmRow{pick, dllm_confidence(raw_stats, stats_of[pick])};
}

}  // namespace xkernels::cpu
