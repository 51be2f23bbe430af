// The host interface of the asynchronous error flag's kernel: plain pointers, no torch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "xkernels/sampling_params.h"

namespace xkernels::cuda {

// ORs each row's invalid per-row sampling values (xkernels/param_errors.h row_param_errors) into
// errors[row], rows 0 .. n - 1, on `stream`. No launch where no per-row tensor is given (every
// word would stay as it is) or n is 0. The bindings of the ops whose kernels do not flag their rows
// themselves (all but chain_verify_ragged_) call it, only when given an errors buffer.
cudaError_t launch_param_errors(const SamplingView& s, int64_t n, int32_t* errors, cudaStream_t stream);

}  // namespace xkernels::cuda
