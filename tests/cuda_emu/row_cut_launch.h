// The filtered target distribution's cut (top-k, then top-p, then min-p; xkernels/reference/
// sampling.py) of many rows in one launch, for the emulation's tests of row_filter.cuh: id x of
// row r is kept when filter_keeps(cuts[r], a_x, x), a_x the scaled logit (logit * inv_t, in float).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "launch_types.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cuda {

struct RowCutParams {
  const void* logits;  // row r at logits + r * row_stride elements, v of them
  LogitsType dtype;
  int64_t rows, v, row_stride;
  int64_t rows_per_request;  // row r takes the parameters s.row(r / rows_per_request)
  SamplingView s;
  FilterCut* cuts;  // [rows]; rows that are greedy or have no active filter keep every id
};

// Launches on `stream`; returns the launch error, if any.
cudaError_t launch_row_cut(const RowCutParams& p, cudaStream_t stream);

}  // namespace xkernels::cuda
