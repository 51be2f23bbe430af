// dllm_step's filtered rows on CUDA (dllm_kernel.cu's comment, step 0), a masked row that samples
// with a filter:
//  a. scan: a block per row reads it once (candidates.cuh's scan_slice, the row one slice, the mask
//     token at -inf): its best kSliceKeep tempered ids and, folded in the same read, its raw
//     statistics in the order dllm_filtered_kernel's statistics pass sums them (each thread's
//     chunks t, t + 256, ...; the same block merge), so that the confidence keeps its bits. A
//     block a row, not a grid of slices, for that order: a thread's running sum cannot be split.
//  b. pick: a block per row finds the cut from the candidates (select_cut, or min-p alone's floor
//     above every dropped key: plain sampling needs no kept sum) and draws over the kept ids
//     (Gumbel-max with the noise dllm_filtered_kernel's draw gives them: the same token), then the
//     confidence softmax(raw)[pick].
//  c. dllm_filtered_kernel, a block per row the pipeline did not settle (top-k beyond the
//     candidates, ties at the cut, flat rows; an aligned row where the others are not, whose
//     statistics that kernel reads id by id) picks its token whole (dllm_filtered_pick).
// Instantiated a logits type a file (dllm_filtered_<type>_kernel.cu): the selection dllm_filtered_kernel
// inlines is most of the op's compile time.
#pragma once

#include "candidates.cuh"
#include "dllm_kernels.cuh"
#include "dllm_row.cuh"
#include "row_filter.cuh"

namespace xkernels::cuda {

// Whether the pipeline can serve filtered row `row`: its scan reads it as dllm_filtered_kernel's
// statistics pass does, by 16-byte chunks exactly where every row starts aligned (scan_slice
// decides by the row's own start).
template <typename T>
__device__ __forceinline__ bool scans_in_order(const DllmParams& p, int64_t row, bool vector_ok) {
  const auto start = reinterpret_cast<uintptr_t>(static_cast<const T*>(p.logits) + row * p.v);
  return (start % 16 == 0) == vector_ok;
}

// scan_slice's reads of a row folded into its raw statistics (the mask token at -inf), as
// for_each_row_value hands them to thread_row_stats: each thread's chunks (or ids) in its order.
template <typename T>
struct RawStatsHook {
  const T* row;
  int64_t mask;
  RowStats s;
  __device__ __forceinline__ void chunk(const uint4& x, int64_t c) {
    constexpr int kIds = 16 / sizeof(T);
    float a[kIds];
    unpack<T>(x, 1.0f, a);
    const int64_t base = kIds * c;
    if (static_cast<uint64_t>(mask - base) < static_cast<uint64_t>(kIds)) {
#pragma unroll
      for (int j = 0; j < kIds; ++j)
        if (base + j == mask) a[j] = kNegInf;
    }
    observe_chunk_in_order<false>(s, a, static_cast<int32_t>(base));
  }
  __device__ __forceinline__ void id(int64_t i) {
    stats_observe(s, i == mask ? kNegInf : to_float(row[i]) * 1.0f, static_cast<int32_t>(i));
  }
};

// a. A block per row (kWithTotal: top-p without top-k, whose select needs the total mass; a launch
// for each, the other rows exit at once).
template <typename T, bool kWithTotal>
__global__ void __launch_bounds__(kThreads, 3) dllm_scan_kernel(DllmParams p, DllmCandidates c, bool vector_ok) {
  __shared__ ScanShared sh;
  const int64_t row = blockIdx.x;
  if (!filtered_row(p, row) || !scans_in_order<T>(p, row, vector_ok)) return;  // the same for the whole block
  const RowSampling rs = p.rule.s.row(row / p.l);
  if (select_needs_total(rs, p.v) != kWithTotal) return;
  constexpr int kIds = 16 / sizeof(T);
  const T* src = static_cast<const T*>(p.logits) + row * p.v;
  RawStatsHook<T> raw{src, p.rule.mask_id, stats_empty()};
  scan_slice<T, kWithTotal>(sh, RowView<T>{src, p.v, rs.inv_t, p.rule.mask_id}, 0,
                                            (p.v + kIds - 1) / kIds, c.sums + row, c.cands + row * kSliceKeep, raw);
  const RowStats merged = block_merge(raw.s, stats_empty());
  if (threadIdx.x == 0) c.raw[row] = merged;
}

// b. A block per row: its cut, token and confidence where the candidates settle it (settled[row]).
template <typename T>
__global__ void __launch_bounds__(kThreads) dllm_pick_kernel(DllmParams p, DllmCandidates c, int64_t* x0,
                                                             bool vector_ok, int mass_shift) {
  __shared__ SelectShared sh;
  const int64_t row = blockIdx.x;
  if (!filtered_row(p, row)) return;  // the same for the whole block
  if (!scans_in_order<T>(p, row, vector_ok)) {
    if (threadIdx.x == 0) c.settled[row] = 0;
    return;
  }
  const RowSampling rs = p.rule.s.row(row / p.l);
  RowCut cut;
  bool settled = select_cut(sh, c.sums + row, c.cands + row * kSliceKeep, 1, rs, p.v, mass_shift, &cut);
  const int n = sh.offset[1];  // the head: every id ranked above tau*, ranked
  if (!settled && top_bits(rs, p.v) == TopBits::kNone && !(rs.top_p < 1.0f) && rs.min_p > 0.0f) {
    // min-p alone keeps the ids at or above its floor (filter_cut's cut), all in the head where the
    // floor is above every dropped key
    const float floor = min_p_floor(cut.top.val, rs.min_p);
    settled = sh.tau == 0u || floor > key_value(sh.tau);
    cut.cut = FilterCut{floor, 0x7FFFFFFF};
  }
  ArgMax best = argmax_empty();
  if (settled && !cut.degenerate) {
    const RowStream st = p.rule.s.stream(row / p.l);
    const auto slot = static_cast<uint32_t>(row % p.l);
    const uint64_t offset = st.offset_at(slot);
    const uint32_t sequence = st.sequence_at(), position = st.position_at(slot);
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const float a = key_value(sh.head[j].key);
      const int32_t id = sh.head[j].id;
      if (filter_keeps(cut.cut, a, id)) best = argmax_merge(best, gumbel_score(a, id, st.seed, offset, sequence, position));
    }
    best = block_merge(best, argmax_empty());
  }
  if (threadIdx.x != 0) return;
  c.settled[row] = settled;
  if (!settled) return;
  // no softmax, or nothing drawable: the tempered argmax, as dllm_filtered_pick
  const int32_t pick = cut.degenerate || best.val == kNegInf ? cut.top.idx : best.idx;
  const T* src = static_cast<const T*>(p.logits) + row * p.v;
  x0[row] = pick;
  p.confidence[row] = dllm_confidence(c.raw[row], dllm_logit(to_float(src[pick]), pick, p.rule.mask_id));
}

// c. A block per row; rows it does not pick (and those settled, where settled is set) return at
// once. Per-row parameters come through SamplingView.row, which reads values the host did not check
// as off. One block an SM: at two (128 registers) the selection with the draw in its gather spilled
// (sm_90a).
template <typename T>
__global__ void __launch_bounds__(kThreads, 1) dllm_filtered_kernel(DllmParams p, int64_t* x0, const int32_t* settled,
                                                                    int mass_shift, bool vector_ok) {
  __shared__ CutShared sh;
  const int64_t row = blockIdx.x;
  if (!filtered_row(p, row) || (settled && settled[row])) return;
  const RowStream st = p.rule.s.stream(row / p.l);
  const auto slot = static_cast<uint32_t>(row % p.l);
  const DllmPick pick =
      dllm_filtered_pick<16>(sh, static_cast<const T*>(p.logits) + row * p.v, p.v, p.rule.mask_id, p.rule.s.row(row / p.l),
                         mass_shift, st.seed, st.offset_at(slot), st.sequence_at(), st.position_at(slot), vector_ok);
  if (threadIdx.x == 0) x0[row] = pick.token, p.confidence[row] = pick.confidence;
}

template <typename T>
void launch_dllm_filtered(const DllmParams& p, int64_t* x0, const DllmCandidates& c, bool vector_ok,
                          cudaStream_t stream) {
  const auto rows = static_cast<unsigned>(p.n * p.l);
  const int shift = cut_mass_shift(p.v);
  const int32_t* settled = nullptr;
  if (!p.radix_only) {
    dllm_scan_kernel<T, false><<<rows, kThreads, 0, stream>>>(p, c, vector_ok);
    dllm_scan_kernel<T, true><<<rows, kThreads, 0, stream>>>(p, c, vector_ok);
    dllm_pick_kernel<T><<<rows, kThreads, 0, stream>>>(p, c, x0, vector_ok, shift);
    settled = c.settled;
  }
  dllm_filtered_kernel<T><<<rows, kThreads, 0, stream>>>(p, x0, settled, shift, vector_ok);
}

}  // namespace xkernels::cuda
