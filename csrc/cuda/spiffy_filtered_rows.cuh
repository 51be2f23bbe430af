// The kernels of spiffy_materialize's filtered rows that read them (spiffy_filtered.cuh's launches 1
// and 3), included only by the files that instantiate them, a logits type each
// (spiffy_filtered_rows_<type>_kernel.cu).
#pragma once

#include "spiffy_filtered.cuh"

namespace xkernels::cuda {

// The tempered view of masked row `row`, whose sequence samples; the mask token reads as -inf.
template <typename T>
__device__ __forceinline__ RowView<T> filtered_view(const SpiffyMaterializeParams& p, int64_t row,
                                                    const RowSampling& rs) {
  return RowView<T>{static_cast<const T*>(p.logits) + row * p.v, p.v, spiffy_scale(rs), p.mask_id};
}

// Launch 1: block (row, slice) of a filtered row scans its slice (other rows, and those of the
// other kWithTotal, exit; a launch for each).
template <typename T, bool kWithTotal>
__global__ void __launch_bounds__(kThreads, 4) spiffy_scan_kernel(SpiffyMaterializeParams p, FilteredSpace f) {
  __shared__ ScanShared sh;
  const int64_t row = blockIdx.x / f.layout.slices, slice = blockIdx.x % f.layout.slices;
  if (!filtered_row(p, row)) return;  // the whole block
  const RowSampling rs = p.s.row(row / p.l);
  if (select_needs_total(rs, p.v) != kWithTotal) return;
  const int64_t begin = slice * f.layout.chunks;
  scan_slice<T, kWithTotal>(sh, filtered_view<T>(p, row, rs), begin, begin + f.layout.chunks, f.sums + blockIdx.x,
                            f.cands + static_cast<int64_t>(blockIdx.x) * kSliceKeep);
}

// Launch 3: the rows select did not settle, a block a row (the others exit): the statistics pass
// noting the top key bits (the top is select's: the same value), then filter_cut and kept_sum, as
// the block-a-row kernel did before the pipeline. One block an SM: the selection takes the registers.
template <typename T>
__global__ void __launch_bounds__(kThreads, 1) spiffy_filtered_rows_kernel(SpiffyMaterializeParams p, FilteredSpace f,
                                                                          int mass_shift) {
  __shared__ CutShared sh;
  const int64_t row = blockIdx.x;
  if (!filtered_row(p, row) || f.rows[row].settled) return;  // the whole block
  const RowSampling rs = p.s.row(row / p.l);
  const RowView<T> r = filtered_view<T>(p, row, rs);
  const TopBits bits = top_bits(rs, p.v);
  const float top = bits == TopBits::kNone ? f.rows[row].top : row_top_noting_bits(sh, r, bits);
  FilterCut cut = keep_all();
  float sum = 0.0f;
  if (is_finite_f32(top)) {  // always: select settles a row without a softmax (scored as it is, no cut)
    unsigned long long kept;
    cut = filter_cut(sh, r, top, rs, mass_shift, &kept);
    if (cut_active(cut)) sum = kept_sum(r, cut, top, kept, mass_shift);
  }
  if (threadIdx.x == 0) f.rows[row] = FilteredRow{cut, sum, top, 1};
}

template <typename T>
void launch_spiffy_filtered_scan(const SpiffyMaterializeParams& p, const FilteredSpace& f, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(p.n * p.l * f.layout.slices);
  spiffy_scan_kernel<T, false><<<blocks, kThreads, 0, stream>>>(p, f);
  spiffy_scan_kernel<T, true><<<blocks, kThreads, 0, stream>>>(p, f);
}

template <typename T>
void launch_spiffy_filtered_rows(const SpiffyMaterializeParams& p, const FilteredSpace& f, cudaStream_t stream) {
  spiffy_filtered_rows_kernel<T><<<p.n * p.l, kThreads, 0, stream>>>(p, f, cut_mass_shift(p.v));
}

}  // namespace xkernels::cuda
