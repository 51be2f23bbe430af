// What dllm_step's CUDA files share (dllm_kernel.cu runs the op; dllm_filtered.cuh holds the
// filtered rows' kernel, instantiated a logits type a file for compile time).
#pragma once

#include <cstdint>

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

// Launches dllm_filtered_kernel over every row (rows it does not pick return at once); instantiated
// in dllm_filtered_<type>_kernel.cu.
template <typename T>
void launch_dllm_filtered(const DllmParams& p, int64_t* x0, bool vector_ok, cudaStream_t stream);

}  // namespace xkernels::cuda
