// What spiffy_materialize's filtered rows share (issue 41): the masked rows whose sequence filters
// get their raw statistics and top tokens from the slices pass, as every masked row
// (spiffy_rows_kernel), and their cut and kept sum from the candidate pipeline (candidates.cuh):
//  1. scan: a block per (filtered row, slice) reads its slice once (the mask token at -inf);
//  2. select: a block per row merges its slices' candidates into the row's cut and kept sum
//     (spiffy_materialize_kernel.cu, one kernel for every logits type);
//  3. radix: a block per row the candidates did not settle (min-p alone, top-k beyond them, flat
//     rows) finds its cut by row_filter.cuh's radix path, as before the pipeline.
// The cut and kept fixed-point sum are the radix path's either way, so the drafts and scores are too.
// The kernels of 1 and 3 (spiffy_filtered_rows.cuh) are instantiated a logits type a file
// (spiffy_filtered_rows_<type>_kernel.cu), as the filtered accept walk and its prepare kernel here are
// (spiffy_filtered_accept_[prepare_|cluster_]<type>_kernel.cu): they take most of the Spiffy kernels'
// compile time.
#pragma once

#include "candidates.cuh"
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

// The filtered walk's prepare kernel: every row picked by dllm_filtered_pick.
template <typename T>
cudaError_t launch_filtered_accept_prepare(const SpiffyAcceptParams& p, const AcceptWorkspace& ws, bool vector_ok,
                                           cudaStream_t stream) {
  return launch_accept_prepare<T, true>(p, ws, vector_ok, stream);
}

// The filtered walk: every row picked by dllm_filtered_pick.
template <typename T, bool kCluster>
cudaError_t launch_filtered_accept_walk(const SpiffyAcceptParams& p, const AcceptWorkspace& ws, unsigned blocks,
                                        bool vector_ok, cudaStream_t stream) {
  return launch_accept_walk<T, kCluster, true>(p, ws, blocks, vector_ok, stream);
}

}  // namespace xkernels::cuda
