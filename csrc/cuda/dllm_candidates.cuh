// A masked row's filtered pick from the candidate pipeline (candidates.cuh), a row one slice: the
// same token and confidence as dllm_filtered_pick (dllm_row.cuh) in one read of the row where the
// candidates settle its cut. dllm_step's filtered rows (dllm_filtered.cuh) and spiffy_accept's
// prepared rows (spiffy_filtered.cuh) take it:
//  a. dllm_scan_row, a block a row: its best kSliceKeep tempered ids and, folded in the same read,
//     its raw statistics in the order dllm_filtered_pick's statistics pass sums them (each thread's
//     chunks t, t + 256, ...; the same block merge), so that the confidence keeps its bits. A block
//     a row, not a grid of slices, for that order: a thread's running sum cannot be split.
//  b. dllm_pick_candidates, a block a row: the cut from the candidates (select_cut), the draw over
//     the kept ids (Gumbel-max with the noise dllm_filtered_pick gives them: the same token), then the
//     confidence softmax(raw)[pick]. A row it does not settle goes to dllm_filtered_pick whole.
// Where a kernel's block picks its rows one after another (spiffy_accept's walk), a and b run in
// that block, the candidates in its shared memory: dllm_block_filtered_pick.
#pragma once

#include "candidates.cuh"
#include "dllm_row.cuh"

namespace xkernels::cuda {

// Whether the row at `src` is scanned in dllm_filtered_pick's order: by 16-byte chunks exactly
// where every row starts aligned (scan_slice decides by the row's own start, the statistics pass
// by vector_ok).
template <typename T>
__device__ __forceinline__ bool scans_in_order(const T* src, bool vector_ok) {
  return (reinterpret_cast<uintptr_t>(src) % 16 == 0) == vector_ok;
}

// Whether the masked row at `src` may be picked from its candidates: it is sampled, filtered and
// scanned in dllm_filtered_pick's order. Every other row goes to dllm_filtered_pick alone.
template <typename T>
__device__ __forceinline__ bool picks_from_candidates(const RowSampling& rs, int64_t v, const T* src, bool vector_ok) {
  return rs.inv_t != 0.0f && filters_active(rs, v) && scans_in_order(src, vector_ok);
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

// a. The whole block reads masked row `src` once: its summary and candidates into *sum and cands
// (kWithTotal: with the mass sums, for top-p without top-k, select_needs_total), and its raw
// statistics, returned at thread 0.
template <typename T, bool kWithTotal>
__device__ __forceinline__ RowStats dllm_scan_row(ScanShared& sh, const T* src, int64_t v, int64_t mask,
                                                  const RowSampling& rs, SliceSummary* sum, Candidate* cands) {
  constexpr int kIds = 16 / sizeof(T);
  RawStatsHook<T> raw{src, mask, stats_empty()};
  scan_slice<T, kWithTotal>(sh, RowView<T>{src, v, rs.inv_t, mask}, 0, (v + kIds - 1) / kIds, sum, cands, raw);
  return block_merge(raw.s, stats_empty());
}

struct SettledPick {
  bool settled;   // the candidates settled the row: pick is dllm_filtered_pick's
  DllmPick pick;
};

// b. The whole block picks row `src` from what dllm_scan_row left (its raw statistics at *raw) at
// the stream position (seed, offset, sequence, position); the result at thread 0.
template <typename T>
__device__ __forceinline__ SettledPick dllm_pick_candidates(SelectShared& sh, const SliceSummary* sum,
                                                            const Candidate* cands, const RowStats* raw, const T* src,
                                                            int64_t v, int64_t mask, const RowSampling& rs,
                                                            int mass_shift, uint64_t seed, uint64_t offset,
                                                            uint32_t sequence, uint32_t position) {
  RowCut cut;
  const bool settled = select_cut(sh, sum, cands, 1, rs, v, mass_shift, &cut);
  const int n = sh.offset[1];  // the head: every id ranked above tau*, ranked
  ArgMax best = argmax_empty();
  if (settled && !cut.degenerate) {
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const float a = key_value(sh.head[j].key);
      const int32_t id = sh.head[j].id;
      if (filter_keeps(cut.cut, a, id)) best = argmax_merge(best, gumbel_score(a, id, seed, offset, sequence, position));
    }
    best = block_merge(best, argmax_empty());
  }
  if (threadIdx.x != 0 || !settled) return SettledPick{settled, DllmPick{-1, 0.0f}};
  // no softmax, or nothing drawable: the tempered argmax, as dllm_filtered_pick
  const int32_t pick = cut.degenerate || best.val == kNegInf ? cut.top.idx : best.idx;
  return SettledPick{true, DllmPick{pick, dllm_confidence(*raw, dllm_logit(to_float(src[pick]), pick, mask))}};
}

// The shared memory of dllm_block_filtered_pick: one of the three steps' at a time, and the scan's
// output, which the select step reads.
struct BlockPickShared {
  union {
    ScanShared scan;
    SelectShared select;
    CutShared cut;
  };
  SliceSummary sum;
  Candidate cands[kSliceKeep];
};

// dllm_filtered_pick<kDepth> of row `src` by the whole block, through a and b where the row may
// settle from its candidates (a sampled row that filters, scanned in dllm_filtered_pick's order, and
// `candidates`): one read of the row where it settles, where dllm_filtered_pick reads a filtered row
// twice. The same token and confidence either way; at thread 0 (every thread where the row goes to
// dllm_filtered_pick).
template <int kDepth, typename T>
__device__ __forceinline__ DllmPick dllm_block_filtered_pick(BlockPickShared& sh, const T* src, int64_t v, int64_t mask,
                                             const RowSampling& rs, int mass_shift, uint64_t seed, uint64_t offset,
                                             uint32_t sequence, uint32_t position, bool vector_ok, bool candidates) {
  if (candidates && picks_from_candidates(rs, v, src, vector_ok)) {
    const RowStats raw = select_needs_total(rs, v)
                             ? dllm_scan_row<T, true>(sh.scan, src, v, mask, rs, &sh.sum, sh.cands)
                             : dllm_scan_row<T, false>(sh.scan, src, v, mask, rs, &sh.sum, sh.cands);
    __syncthreads();  // the summary and candidates, to every thread; the scan's state is free
    const SettledPick got = dllm_pick_candidates(sh.select, &sh.sum, sh.cands, &raw, src, v, mask, rs, mass_shift,
                                                 seed, offset, sequence, position);
    __syncthreads();  // select's state and the candidates are read before a next row, or the radix path, reuses them
    if (got.settled) return got.pick;  // the same at every thread
  }
  return dllm_filtered_pick<kDepth>(sh.cut, src, v, mask, rs, mass_shift, seed, offset, sequence, position,
                                    vector_ok);
}

}  // namespace xkernels::cuda
