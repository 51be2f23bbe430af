// The CUDA bindings' side of the asynchronous error flag (param_errors_launch.h holds the launch).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "../ops/sampling_args.h"
#include "binding.h"
#include "param_errors_launch.h"

namespace xkernels::cuda {

// Given `errors` (check_errors'd), ORs every row's bits of `s` into it: param_errors_kernel on the
// current stream, no host sync. `op` names the op should the launch fail.
inline void flag_param_errors(const SamplingArgs& s, const std::optional<at::Tensor>& errors, const char* op) {
  if (errors)
    check_launch(launch_param_errors(sampling_view(s), s.n, errors->mutable_data_ptr<int32_t>(), stream()), op);
}

}  // namespace xkernels::cuda
