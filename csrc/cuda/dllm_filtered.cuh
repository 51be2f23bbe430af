// dllm_step's filtered rows on CUDA (dllm_kernel.cu's comment, step 0), a masked row that samples
// with a filter:
//  a. scan: a block per row reads it once (dllm_candidates.cuh's dllm_scan_row);
//  b. pick: a block per row picks its token from the candidates (dllm_pick_candidates);
//  c. dllm_filtered_kernel, a block per row the pipeline did not settle (top-k beyond the
//     candidates, ties at the cut, flat rows; an aligned row where the others are not, whose
//     statistics that kernel reads id by id) picks its token whole (dllm_filtered_pick).
// Instantiated a logits type a file (dllm_filtered_<type>_kernel.cu): the selection dllm_filtered_kernel
// inlines is most of the op's compile time.
#pragma once

#include "dllm_candidates.cuh"
#include "dllm_kernels.cuh"
#include "dllm_row.cuh"
#include "row_filter.cuh"

namespace xkernels::cuda {

// a. A block per row (kWithTotal: top-p without top-k, whose select needs the total mass; a launch
// for each, the other rows exit at once).
template <typename T, bool kWithTotal>
__global__ void __launch_bounds__(kThreads, 3) dllm_scan_kernel(DllmParams p, DllmCandidates c, bool vector_ok) {
  __shared__ ScanShared sh;
  const int64_t row = blockIdx.x;
  const T* src = static_cast<const T*>(p.logits) + row * p.v;
  if (!filtered_row(p, row) || !scans_in_order(src, vector_ok)) return;  // the same for the whole block
  const RowSampling rs = p.rule.s.row(row / p.l);
  if (select_needs_total(rs, p.v) != kWithTotal) return;
  const RowStats raw = dllm_scan_row<T, kWithTotal>(sh, src, p.v, p.rule.mask_id, rs, c.sums + row,
                                                    c.cands + row * kSliceKeep);
  if (threadIdx.x == 0) c.raw[row] = raw;
}

// b. A block per row: its token and confidence where the candidates settle it (settled[row]).
template <typename T>
__global__ void __launch_bounds__(kThreads) dllm_pick_kernel(DllmParams p, DllmCandidates c, int64_t* x0,
                                                             bool vector_ok, int mass_shift) {
  __shared__ SelectShared sh;
  const int64_t row = blockIdx.x;
  if (!filtered_row(p, row)) return;  // the same for the whole block
  const T* src = static_cast<const T*>(p.logits) + row * p.v;
  if (!scans_in_order(src, vector_ok)) {
    if (threadIdx.x == 0) c.settled[row] = 0;
    return;
  }
  const RowStream st = p.rule.s.stream(row / p.l);
  const auto slot = static_cast<uint32_t>(row % p.l);
  const SettledPick got = dllm_pick_candidates(sh, c.sums + row, c.cands + row * kSliceKeep, c.raw + row, src, p.v,
                                               p.rule.mask_id, p.rule.s.row(row / p.l), mass_shift, st.seed,
                                               st.offset_at(slot), st.sequence_at(), st.position_at(slot));
  if (threadIdx.x != 0) return;
  c.settled[row] = got.settled;
  if (got.settled) x0[row] = got.pick.token, p.confidence[row] = got.pick.confidence;
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
