// dllm_step's filtered rows on CUDA (dllm_kernel.cu's comment, step 0): a block per masked row that
// samples with a filter picks its token whole (dllm_filtered_pick). Instantiated a logits type a file
// (dllm_filtered_<type>_kernel.cu): the selection it inlines is most of the op's compile time.
#pragma once

#include "dllm_kernels.cuh"
#include "dllm_row.cuh"
#include "row_filter.cuh"

namespace xkernels::cuda {

// A block per row; rows it does not pick return at once. Per-row parameters come through
// SamplingView.row, which reads values the host did not check as off. One block an SM: at two
// (128 registers) the selection with the draw in its gather spilled (sm_90a).
template <typename T>
__global__ void __launch_bounds__(kThreads, 1) dllm_filtered_kernel(DllmParams p, int64_t* x0, int mass_shift,
                                                                    bool vector_ok) {
  __shared__ CutShared sh;
  const int64_t row = blockIdx.x;
  if (!filtered_row(p, row)) return;
  const RowStream st = p.rule.s.stream(row / p.l);
  const auto slot = static_cast<uint32_t>(row % p.l);
  const DllmPick pick =
      dllm_filtered_pick<16>(sh, static_cast<const T*>(p.logits) + row * p.v, p.v, p.rule.mask_id, p.rule.s.row(row / p.l),
                         mass_shift, st.seed, st.offset_at(slot), st.sequence_at(), st.position_at(slot), vector_ok);
  if (threadIdx.x == 0) x0[row] = pick.token, p.confidence[row] = pick.confidence;
}

template <typename T>
void launch_dllm_filtered(const DllmParams& p, int64_t* x0, bool vector_ok, cudaStream_t stream) {
  dllm_filtered_kernel<T><<<p.n * p.l, kThreads, 0, stream>>>(p, x0, cut_mass_shift(p.v), vector_ok);
}

}  // namespace xkernels::cuda
