// What dllm_step's CUDA files share (dllm_kernel.cu runs the op; dllm_filtered.cuh holds the
// filtered rows' kernel, instantiated a logits type a file for compile time).
#pragma once

#include <cstdint>

#include "candidates.cuh"
#include "device_utils.cuh"
#include "dllm_launch.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cuda {

// Whether dllm_filtered_kernel picks row `row` (masked, sampled, some filter active); the same for
// a whole block. The slices kernel skips exactly these rows.
__device__ __forceinline__ bool filtered_row(const DllmParams& p, int64_t row) {
  if (!p.rule.filtered || p.block[row] != p.rule.mask_id) return false;
  const RowSampling rs = p.rule.s.row(row / p.l);
  return rs.inv_t != 0.0f && filters_active(rs, p.v);
}

// The candidate pipeline's workspace for the filtered rows (dllm_filtered.cuh), a row one slice.
struct DllmCandidates {
  SliceSummary* sums;  // [rows]
  Candidate* cands;    // [rows, kSliceKeep]
  RowStats* raw;       // [rows]: the raw statistics, as dllm_filtered_kernel's pass sums them
  int32_t* settled;    // [rows]: the pipeline picked the row
};

// Launches the filtered rows' kernels over every row (rows they do not pick return at once): the
// candidate pipeline, then dllm_filtered_kernel for the rows it did not settle; instantiated in
// dllm_filtered_<type>_kernel.cu. vector_ok: every row starts 16-byte aligned.
template <typename T>
void launch_dllm_filtered(const DllmParams& p, int64_t* x0, const DllmCandidates& c, bool vector_ok,
                          cudaStream_t stream);

}  // namespace xkernels::cuda
