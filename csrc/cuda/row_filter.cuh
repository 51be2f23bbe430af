// The filtered target distribution's cut on CUDA, by one block of kThreads threads per row: radix
// selection over the order-preserving bits of the scaled logits (4 passes of 8 bits for top-k by
// count, 4 for top-p by mass, one ordered pass when ties at the cut must be split by id). Masses
// are summed in 64-bit fixed point, so the cut does not depend on the order of the atomics.
// chain_ragged_kernel.cu and row_cut_kernel.cu (launch_row_cut, for the other ops) share it.
#pragma once

#include <cstdint>

#include "device_utils.cuh"
#include "xkernels/sampling.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cuda {

// Keeps every id.
__device__ __forceinline__ FilterCut keep_all() { return FilterCut{kNegInf, 0x7FFFFFFF}; }

// Larger keys for larger floats (NaN aside, which rows with a softmax do not hold).
__device__ __forceinline__ uint32_t order_key(float a) {
  const uint32_t bits = __float_as_uint(a);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// exp(gap) (<= 1) in fixed point with `shift` fractional bits, truncated: exact in double.
__device__ __forceinline__ unsigned long long fixed_mass(float gap, int shift) {
  return static_cast<unsigned long long>(static_cast<double>(exp_f32(gap)) * static_cast<double>(1ull << shift));
}

// The fractional bits of fixed_mass for rows of v ids: v masses of at most 1 sum below 2^62.
inline int cut_mass_shift(int64_t v) {
  int bits = 0;
  for (; v > 0; v >>= 1) ++bits;
  return 62 - bits;
}

template <typename T>
struct RowView {
  const T* row;
  int64_t v;
  float scale;
  __device__ __forceinline__ float a(int64_t i) const { return to_float(row[i]) * scale; }
};

// The shared memory of one block's selection.
struct CutShared {
  uint32_t count[256];
  unsigned long long mass[256];
  uint32_t warp_counts[kWarps];
  double target, before;
  uint32_t prefix, tie_count, need;
  unsigned long long tie_mass;
  int32_t found;
  bool keep_all;
};

// The cut of the smallest prefix of the ranking, among the ids `within` keeps, whose count reaches
// k (by_mass false) or whose mass reaches top_p of theirs (by_mass true). keep_all() when no prefix
// reaches it (fewer finite ids than k).
template <typename T>
__device__ FilterCut radix_cut(CutShared& sh, const RowView<T>& r, float top, const FilterCut& within, bool by_mass,
                               uint32_t k, float top_p, int mass_shift) {
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads) {
      sh.count[d] = 0;
      sh.mass[d] = 0;
    }
    __syncthreads();
    const uint32_t prefix = shift == 24 ? 0u : sh.prefix;
    for (int64_t i = threadIdx.x; i < r.v; i += kThreads) {
      const float a = r.a(i);
      if (a == kNegInf || !filter_keeps(within, a, static_cast<int32_t>(i))) continue;
      const uint32_t key = order_key(a);
      if ((key & mask) != prefix) continue;
      const uint32_t d = (key >> shift) & 255u;
      atomicAdd(&sh.count[d], 1u);
      if (by_mass) atomicAdd(&sh.mass[d], fixed_mass(a - top, mass_shift));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (shift == 24) {
        double total = 0.0;
        for (int d = 0; d < 256; ++d) total += by_mass ? static_cast<double>(sh.mass[d]) : sh.count[d];
        sh.target = by_mass ? static_cast<double>(top_p) * total : static_cast<double>(k);
        sh.before = 0.0;
        sh.prefix = 0;
        sh.keep_all = !(total >= sh.target);
      }
      if (!sh.keep_all) {
        int d = 255;
        for (; d >= 0; --d) {
          const double m = by_mass ? static_cast<double>(sh.mass[d]) : sh.count[d];
          if (sh.before + m >= sh.target) break;
          sh.before += m;
        }
        if (d < 0) {
          sh.keep_all = true;  // only by rounding
        } else {
          sh.prefix |= static_cast<uint32_t>(d) << shift;
          sh.tie_count = sh.count[d];
          sh.tie_mass = sh.mass[d];
        }
      }
    }
    __syncthreads();
    if (sh.keep_all) return keep_all();
    mask |= 255u << shift;
  }
  // The ids at the cut's value all carry the same mass; the lower ids are kept first.
  if (threadIdx.x == 0) {
    const double missing = sh.target - sh.before;
    double need = missing;
    if (by_mass) need = missing / static_cast<double>(sh.tie_mass / sh.tie_count);
    uint32_t n = need <= 1.0 ? 1u : static_cast<uint32_t>(ceil(need));
    sh.need = n < sh.tie_count ? n : sh.tie_count;
    sh.found = -1;
  }
  __syncthreads();
  const uint32_t key = sh.prefix, need = sh.need;
  const float value = key_value(key);
  if (need == sh.tie_count) return FilterCut{value, 0x7FFFFFFF};
  uint32_t running = 0;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t base = 0; base < r.v; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    bool hit = false;
    if (i < r.v) {
      const float a = r.a(i);
      hit = a != kNegInf && filter_keeps(within, a, static_cast<int32_t>(i)) && order_key(a) == key;
    }
    const unsigned ballot = __ballot_sync(kFullMask, hit);
    if (lane == 0) sh.warp_counts[warp] = __popc(ballot);
    __syncthreads();
    uint32_t before = running;
    for (int w = 0; w < warp; ++w) before += sh.warp_counts[w];
    before += __popc(ballot & ((1u << lane) - 1u));
    if (hit && before + 1 == need) sh.found = static_cast<int32_t>(i);
    for (int w = 0; w < kWarps; ++w) running += sh.warp_counts[w];
    __syncthreads();
    if (sh.found >= 0) break;
  }
  return FilterCut{value, sh.found};
}

// `cut` narrowed by min-p (a - top >= min_gap, in float, as the filters test it), without a pass
// over the row: a - top only grows with a, so min-p keeps the values at or above the smallest
// float that passes, found by stepping the keys from top + min_gap (a few steps: rounding).
__device__ __forceinline__ FilterCut with_min_p(const FilterCut& cut, float top, float min_gap) {
  uint32_t key = order_key(top + min_gap);
  while (key_value(key) - top < min_gap) ++key;       // stops at top, or at +inf, at the latest
  while (key_value(key - 1) - top >= min_gap) --key;  // stops above -inf
  const float floor = key_value(key);
  return floor > cut.val ? FilterCut{floor, 0x7FFFFFFF} : cut;
}

// The cut of all three filters (top-k, then top-p within it, then min-p) of a row whose largest
// scaled logit `top` is finite.
template <typename T>
__device__ FilterCut filter_cut(CutShared& sh, const RowView<T>& r, float top, const RowSampling& rs, int mass_shift) {
  FilterCut cut = keep_all();
  if (rs.top_k > 0 && rs.top_k < r.v)
    cut = radix_cut(sh, r, top, keep_all(), false, static_cast<uint32_t>(rs.top_k), 1.0f, mass_shift);
  if (rs.top_p < 1.0f) cut = radix_cut(sh, r, top, cut, true, 0u, rs.top_p, mass_shift);
  if (rs.min_p > 0.0f) cut = with_min_p(cut, top, log_f32(rs.min_p));
  return cut;
}

}  // namespace xkernels::cuda
