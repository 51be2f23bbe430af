// spiffy_materialize's sampling arguments, which the CPU and CUDA kernels both take.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "sampling_args.h"

namespace xkernels {

// spiffy_materialize's sampling arguments: the step distribution's, without a stream (it draws
// nothing).
#define XK_SPIFFY_FILTER_ARGS                                                                              \
  double temperature, const std::optional<at::Tensor>&temperature_tensor, int64_t top_k,                   \
      const std::optional<at::Tensor>&top_k_tensor, double top_p, const std::optional<at::Tensor>&top_p_tensor, \
      double min_p, const std::optional<at::Tensor>&min_p_tensor
#define XK_SPIFFY_FILTER_FORWARD \
  temperature, temperature_tensor, top_k, top_k_tensor, top_p, top_p_tensor, min_p, min_p_tensor
SamplingArgs spiffy_filter_args(int64_t n, const at::Device& device, XK_SPIFFY_FILTER_ARGS, std::string_view filter_order,
                                bool check_rows = true);

}  // namespace xkernels
