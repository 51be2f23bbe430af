// Per-request sampling parameters and random streams, shared by the CPU and CUDA kernels:
// the filtered target distribution's cut, each row's Philox stream, and block verification's
// acceptance rule. xkernels/reference/sampling.py and chain.py state the same in PyTorch.
#pragma once

#include <cstdint>

#include "xkernels/host_device.h"
#include "xkernels/sampling.h"

namespace xkernels {

// One request's parameters: inv_t 0 is greedy; top_k 0, top_p 1 and min_p 0 are off. The filters
// apply top-k, then top-p within what top-k keeps, then min-p; with min_p_first (vLLM's order,
// filter_order="min_p_first"), min-p, then top-k, then top-p within what both keep. Every filter
// keeps a prefix of the ranking and min-p's is the same in both, so the orders differ only where
// min-p and top-p are both on: top-p's mass is then renormalised over the ids min-p keeps too.
struct RowSampling {
  float inv_t;
  int32_t top_k;
  float top_p;
  float min_p;
  bool min_p_first = false;
};

XK_HD bool filters_active(const RowSampling& r, int64_t vocab) {
  return (r.top_k > 0 && r.top_k < vocab) || r.top_p < 1.0f || r.min_p > 0.0f;
}

// Ids are ranked by scaled logit, a higher one first and ties to the lower id; every filter keeps
// a prefix of that ranking, so what the filters keep is the ids ranked at or before `cut`.
struct FilterCut {
  float val;
  int32_t idx;
};

XK_HD bool filter_keeps(const FilterCut& cut, float a, int32_t v) {
  return a > cut.val || (a == cut.val && v <= cut.idx);
}

// The radix selections' keys: larger for larger floats (NaN aside, which rows with a softmax do not
// hold; -0 keys below +0), negative values with every bit flipped, others the sign only (without a
// branch: signs are random); and the float of a key.
XK_HD uint32_t order_key(float a) {
  const uint32_t bits = float_bits(a);
  return bits ^ (static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u);
}

XK_HD float key_value(uint32_t key) {
  return float_from_bits((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// The Philox stream of one request. The scalar form keys slot i of batch row `sequence` by
// (seed, offset, sequence, i), today's stream; the per-request form keys it by (seed, offset + i)
// with sequence and position 0, so the request's noise is the same at any row of any batch.
struct RowStream {
  uint64_t seed, offset;
  uint32_t sequence;
  bool per_request;

  XK_HD uint64_t offset_at(uint32_t slot) const { return per_request ? offset + slot : offset; }
  XK_HD uint32_t sequence_at() const { return per_request ? 0u : sequence; }
  XK_HD uint32_t position_at(uint32_t slot) const { return per_request ? 0u : slot; }
  XK_HD float coin(uint32_t slot) const {
    return acceptance_coin(seed, offset_at(slot), sequence_at(), position_at(slot));
  }
};

// Every row's parameters and stream as a kernel reads them, from plain pointers (null where the
// scalar applies), so any op's CPU or CUDA kernel takes per-request arguments the same way.
struct SamplingView {
  RowSampling scalar;
  const float* temperature;  // [n] or null; likewise top_k, top_p and min_p
  const int32_t* top_k;
  const float* top_p;
  const float* min_p;
  uint64_t seed, offset;
  const int64_t* seed_ptr;    // null, one element (the scalar form, read on the device) or [n]
  const int64_t* offset_ptr;
  bool seed_per_row, offset_per_row;  // the pointer holds [n]
  bool per_request;                   // the per-request stream form

  // Row n's parameters. Values the host did not check (CUDA without XKERNELS_CHECK=1) read as
  // off: a temperature that is negative, NaN or infinite as greedy.
  XK_HD RowSampling row(int64_t n) const {
    RowSampling r = scalar;
    if (temperature) {
      const float t = temperature[n];
      const float inv = static_cast<float>(1.0 / static_cast<double>(t));  // as the host's inverse_temperature
      r.inv_t = t > 0.0f && is_finite_f32(t) && is_finite_f32(inv) ? inv : 0.0f;
    }
    if (top_k) r.top_k = top_k[n] > 0 ? top_k[n] : 0;
    if (top_p) r.top_p = top_p[n] > 0.0f && top_p[n] <= 1.0f ? top_p[n] : 1.0f;
    if (min_p) r.min_p = min_p[n] >= 0.0f && min_p[n] <= 1.0f ? min_p[n] : 0.0f;
    return r;
  }
  // Row n's stream; n is also the batch row that keys the scalar form.
  XK_HD RowStream stream(int64_t n) const {
    const uint64_t s = seed_ptr ? static_cast<uint64_t>(seed_ptr[seed_per_row ? n : 0]) : seed;
    const uint64_t o = offset_ptr ? static_cast<uint64_t>(offset_ptr[offset_per_row ? n : 0]) : offset;
    return RowStream{s, o, static_cast<uint32_t>(n), per_request};
  }
};

// Block verification (Sun et al., ICLR 2025). With w_0 = 1, the weight after draft x at a row
// of filtered target probability p_x and draft probability q_x is min(w p_x / q_x, 1); a q_x of
// 0 gives 1 when w p_x > 0 (the limit), else 0.
XK_HD float block_weight(float w, float p_x, float q_x) {
  if (!(q_x > 0.0f)) return w * p_x > 0.0f ? 1.0f : 0.0f;
  const float r = w * p_x / q_x;
  return r < 1.0f ? r : 1.0f;
}

// The acceptance threshold of a prefix of i < K drafts: h_i = Z_i / (Z_i + 1 - w_i), Z_i =
// sum_x max(w_i p_i(x) - q_i(x), 0) the residual mass at row i; 1 where the denominator is 0.
XK_HD float block_threshold(float z, float w) {
  const float denom = z + (1.0f - w);
  return denom > 0.0f ? z / denom : 1.0f;
}

}  // namespace xkernels
