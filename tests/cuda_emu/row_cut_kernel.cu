// launch_row_cut: a block per row finds the row's largest scaled logit in one pass, then, with
// filters, its cut by row_filter.cuh's selection, the one every filtering kernel of xkernels runs
// inside its own read (test_row_cut_emu.py tests it here, alone, against the reference's kept
// sets). Built only into the emulation library (tests/cuda_emu/build.sh), never into xkernels.
// Per-row parameters come through SamplingView.row, which reads values the host did not check as off.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "device_utils.cuh"
#include "row_cut_launch.h"
#include "row_filter.cuh"
#include "xkernels/sampling.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cuda {
namespace {

// Two blocks an SM (128 registers, no spill on sm_90a; unbounded, ptxas took 158 and one block).
template <typename T>
__global__ void __launch_bounds__(kThreads, 2) row_cut_kernel(RowCutParams p, int mass_shift) {
  __shared__ CutShared sh;
  const int64_t row = blockIdx.x;
  const RowSampling rs = p.s.row(row / p.rows_per_request);
  if (rs.inv_t == 0.0f || !filters_active(rs, p.v)) {  // the same for the whole block
    if (threadIdx.x == 0) p.cuts[row] = keep_all();
    return;
  }
  const RowView<T> r{static_cast<const T*>(p.logits) + row * p.row_stride, p.v, rs.inv_t};
  const float t = row_top_noting_bits(sh, r, top_bits(rs, p.v));
  // A row with a NaN or +inf, or all -inf, has no softmax: nothing to cut (the filtered reference
  // returns it as it is).
  unsigned long long kept;  // not returned
  const FilterCut cut = is_finite_f32(t) ? filter_cut(sh, r, t, rs, mass_shift, &kept) : keep_all();
  if (threadIdx.x == 0) p.cuts[row] = cut;
}

}  // namespace

cudaError_t launch_row_cut(const RowCutParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.rows < 0 || p.rows > 0x7FFFFFFF || p.rows_per_request < 1 || p.v < 0 || p.v > 0x7FFFFFFF)
    return cudaErrorInvalidValue;
  const int mass_shift = cut_mass_shift(p.v);
  const unsigned blocks = static_cast<unsigned>(p.rows);
  switch (p.dtype) {
    case LogitsType::kFloat32: row_cut_kernel<float><<<blocks, kThreads, 0, stream>>>(p, mass_shift); break;
    case LogitsType::kBFloat16: row_cut_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(p, mass_shift); break;
    case LogitsType::kFloat16: row_cut_kernel<__half><<<blocks, kThreads, 0, stream>>>(p, mass_shift); break;
  }
  return cudaGetLastError();
}

}  // namespace xkernels::cuda
