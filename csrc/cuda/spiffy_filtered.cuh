// What spiffy_materialize's filtered rows share (issue 41): the masked rows whose sequence filters
// get their raw statistics and top tokens from the slices pass, as every masked row
// (spiffy_rows_kernel), and their cut and kept sum from the candidate pipeline (candidates.cuh):
//  1. scan: a block per (filtered row, slice) reads its slice once (the mask token at -inf);
//  2. select: a block per row merges its slices' candidates into the row's cut and kept sum
//     (spiffy_materialize_kernel.cu, one kernel for every logits type);
//  3. radix: a block per row the candidates did not settle (min-p alone, top-k beyond them, flat
//     rows) finds its cut by row_filter.cuh's radix path, as before the pipeline.
// The cut and kept fixed-point sum are the radix path's either way, so the drafts and scores are too.
// spiffy_accept's prepared rows that filter take dllm_step's pipeline (dllm_candidates.cuh: a block
// a row scans it, a block a row picks its token); the prepare kernel picks the rest as before. The
// walk's own filtered rows take the same steps in the walk's block (accept_row_pick).
// The kernels of 1 and 3 (spiffy_filtered_rows.cuh) are instantiated a logits type a file
// (spiffy_filtered_rows_<type>_kernel.cu), as the filtered accept walk and its prepare kernel here are
// (spiffy_filtered_accept_[prepare_|cluster_]<type>_kernel.cu): they take most of the Spiffy kernels'
// compile time.
#pragma once

#include "candidates.cuh"
#include "dllm_candidates.cuh"
#include "spiffy_kernels.cuh"

namespace xkernels::cuda {

// A masked row's cut and kept sum, as the materialize kernel reads them.
struct FilteredRow {
  FilterCut cut;    // keep_all() where the row does not filter or its cut keeps every id
  float kept_sum;   // where cut_active(cut): the kept ids' sum of exp(a - top), tempered (position_top's)
  float top;        // the tempered row's top (select's), for the radix path
  int32_t settled;  // select found the cut (or the row does not filter)
};

// The filtered rows' workspace.
struct FilteredSpace {
  SliceLayout layout;  // of the candidates' slices (not spiffy_rows_kernel's)
  SliceSummary* sums;  // [rows, slices]
  Candidate* cands;    // [rows, slices, kSliceKeep]
  FilteredRow* rows;   // [rows]
};

// Launches 1 and 3 on logits of type T (spiffy_filtered_rows.cuh).
template <typename T>
void launch_spiffy_filtered_scan(const SpiffyMaterializeParams& p, const FilteredSpace& f, cudaStream_t stream);
template <typename T>
void launch_spiffy_filtered_rows(const SpiffyMaterializeParams& p, const FilteredSpace& f, cudaStream_t stream);

// The prepared rows that filter (spiffy_accept_prepare_kernel's rows whose sequence samples with a
// filter, scanned in dllm_filtered_pick's order) go through the candidate pipeline
// (dllm_candidates.cuh); the same for a whole block. The row's logits at *src.
template <typename T>
__device__ __forceinline__ bool accept_scans_row(const SpiffyAcceptParams& p, AcceptRow a, const RowSampling& rs,
                                                 bool vector_ok, const T** src) {
  *src = accept_node_logits<T>(p, a.n, a.c) + a.q * p.v;
  return picks_from_candidates(rs, p.v, *src, vector_ok);
}

// a. A block a prepared row that filters: its candidates and raw statistics (kWithTotal: top-p
// without top-k; a launch for each, the other rows exit at once).
template <typename T, bool kWithTotal>
__global__ void __launch_bounds__(kThreads, 3) spiffy_accept_scan_kernel(SpiffyAcceptParams p, AcceptWorkspace ws,
                                                                       bool vector_ok) {
  __shared__ ScanShared sh;
  const int64_t r = blockIdx.x;
  const AcceptRow a = accept_row(p, ws, r);
  const RowSampling rs = p.rule.s.row(a.n);
  const T* src;
  if (!accept_scans_row(p, a, rs, vector_ok, &src) || select_needs_total(rs, p.v) != kWithTotal) return;
  if (prepared_row_step(p, ws, a) < 0) return;
  const RowStats raw = dllm_scan_row<T, kWithTotal>(sh, src, p.v, p.rule.mask_id, rs, ws.sums + r,
                                                    ws.cands + r * kSliceKeep);
  if (threadIdx.x == 0) ws.raw[r] = raw;
}

// b. A block a prepared row: settled[r] for every row, and where the candidates settle a row its
// token and confidence at its step's stream (the prepare kernel's).
template <typename T>
__global__ void __launch_bounds__(kThreads) spiffy_accept_pick_kernel(SpiffyAcceptParams p, AcceptWorkspace ws,
                                                                      bool vector_ok, int mass_shift) {
  __shared__ SelectShared sh;
  const int64_t r = blockIdx.x;
  const AcceptRow a = accept_row(p, ws, r);
  const RowSampling rs = p.rule.s.row(a.n);
  const T* src;
  const int64_t s = accept_scans_row(p, a, rs, vector_ok, &src) ? prepared_row_step(p, ws, a) : -1;
  if (s < 0) {
    if (threadIdx.x == 0) ws.settled[r] = 0;
    return;
  }
  const RowStream st = dllm_step_stream(p.rule.s.stream(a.n), s, p.l);
  const auto slot = static_cast<uint32_t>(a.q);
  const SettledPick got = dllm_pick_candidates(sh, ws.sums + r, ws.cands + r * kSliceKeep, ws.raw + r, src, p.v,
                                               p.rule.mask_id, rs, mass_shift, st.seed, st.offset_at(slot),
                                               st.sequence_at(), st.position_at(slot));
  if (threadIdx.x != 0) return;
  ws.settled[r] = got.settled;
  if (got.settled) ws.x0[a.slot] = got.pick.token, ws.conf[a.slot] = got.pick.confidence;
}

// The filtered walk's prepare: the candidate pipeline over the prepared rows (a block a row, where
// the grid allows and p.radix_only is off), then the prepare kernel for every prepared row it did
// not settle (dllm_filtered_pick).
template <typename T>
cudaError_t launch_filtered_accept_prepare(const SpiffyAcceptParams& p, const AcceptWorkspace& ws, bool vector_ok,
                                           cudaStream_t stream) {
  AcceptWorkspace prepared = ws;
  const int64_t rows = p.n * (ws.drafts ? p.k + 1 : 1) * p.l;
  if (ws.settled == nullptr || rows > 0x7FFFFFFF) {
    prepared.settled = nullptr;
  } else {
    const auto grid = static_cast<unsigned>(rows);
    spiffy_accept_scan_kernel<T, false><<<grid, kThreads, 0, stream>>>(p, ws, vector_ok);
    spiffy_accept_scan_kernel<T, true><<<grid, kThreads, 0, stream>>>(p, ws, vector_ok);
    spiffy_accept_pick_kernel<T><<<grid, kThreads, 0, stream>>>(p, ws, vector_ok, cut_mass_shift(p.v));
  }
  return launch_accept_prepare<T, true>(p, prepared, vector_ok, stream);
}

// The filtered walk: a filtered row from its candidates where they settle it, every other row by
// dllm_filtered_pick (accept_row_pick).
template <typename T, bool kCluster>
cudaError_t launch_filtered_accept_walk(const SpiffyAcceptParams& p, const AcceptWorkspace& ws, unsigned blocks,
                                        bool vector_ok, cudaStream_t stream) {
  return launch_accept_walk<T, kCluster, true>(p, ws, blocks, vector_ok, stream);
}

}  // namespace xkernels::cuda
