// The launches of the Spiffy kernels for the rows whose sequence filters (declared in
// spiffy_kernels.cuh). Included only by the files that instantiate them, one logits type each
// (spiffy_filtered_rows_<type>_kernel.cu, spiffy_filtered_accept_[cluster_]<type>_kernel.cu): these
// instantiations take most of the Spiffy kernels' compile time.
#pragma once

#include "spiffy_kernels.cuh"

namespace xkernels::cuda {

// Pass 1 of materialize for the masked rows whose sequence filters, a block a row, in two reads: the
// raw statistics and top tokens, which also note the tempered row's top key bits for the cut, then
// the cut (row_filter.cuh), whose ranked candidates give the kept ids' tempered sum (a pass more
// for min-p alone). The row's result goes to its first slice, the others are emptied;
// every row's cut goes to cuts (keep_all where the row is not filtered). One block an SM, as
// dllm_step's filtered kernel, with 16 loads of 16 B in flight a thread in the first read (64 KB).
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    spiffy_filtered_rows_kernel(SpiffyMaterializeParams p, FilterCut* cuts, RowSlice* out, int slices, int mass_shift,
                                bool vector_ok) {
  __shared__ CutShared sh;
  constexpr int kIds = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  if (!filtered_row(p, row)) {
    if (threadIdx.x == 0) cuts[row] = keep_all();
    return;
  }
  const T* src = static_cast<const T*>(p.logits) + row * p.v;
  const RowSampling rs = p.s.row(row / p.l);
  const float scale = spiffy_scale(rs);  // rs.inv_t: the row samples
  const TopBits bits = top_bits(rs, p.v);
  if (bits != TopBits::kNone) clear_top_bits(sh);
  __syncthreads();
  XK_ROW_PASS();
  RowSlice s = reduce_row_slice<T, true, 16>(src, p.v, SliceRange{0, (p.v + kIds - 1) / kIds}, p.mask_id, scale,
                                            vector_ok, [&](float a, int32_t) { observe_top_bits(sh, a * scale, bits); });
  __syncthreads();  // the top bits are complete
  const float top = s.raw.top.val * scale;  // the tempered top: rounding is monotone
  FilterCut cut = keep_all();
  if (is_finite_f32(top)) {  // a row without a softmax is scored as it is (the filtered reference's rule)
    const RowView<T> r{src, p.v, scale, p.mask_id};
    unsigned long long kept;
    cut = filter_cut(sh, r, top, rs, mass_shift, &kept);
    // The kept ids' sum of exp(a - top): the scaled sum position_top reads, from the raw top at `scale`.
    if (cut_active(cut)) {
      const float sum = kept_sum(r, cut, top, kept, mass_shift);
      if (threadIdx.x == 0) s.scaled_sum = sum;
    }
  }
  if (threadIdx.x == 0) cuts[row] = cut;
  for (int j = threadIdx.x; j < slices; j += kThreads) {
    if (j == 0) {
      out[row * slices] = s;
    } else {
      RowSlice empty{stats_empty(), 0.0f, {}};
      top_clear(empty.top);
      out[row * slices + j] = empty;
    }
  }
}

template <typename T>
void launch_spiffy_filtered_rows(const SpiffyMaterializeParams& p, FilterCut* cuts, RowSlice* rows, int slices,
                                 bool vector_ok, cudaStream_t stream) {
  spiffy_filtered_rows_kernel<T><<<p.n * p.l, kThreads, 0, stream>>>(p, cuts, rows, slices, cut_mass_shift(p.v),
                                                                     vector_ok);
}

// The filtered walk: every row picked by dllm_filtered_pick.
template <typename T, bool kCluster>
cudaError_t launch_filtered_accept_walk(const SpiffyAcceptParams& p, const AcceptWorkspace& ws, unsigned blocks,
                                        bool vector_ok, cudaStream_t stream) {
  return launch_accept_walk<T, kCluster, true>(p, ws, blocks, vector_ok, stream);
}

}  // namespace xkernels::cuda
