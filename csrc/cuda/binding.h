// What the torch bindings of the CUDA kernels share: the launchers' element types from torch
// dtypes, workspace buffers, the current stream and the launch check.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>

#include "../ops/checks.h"
#include "../ops/sampling_args.h"
#include "dllm_launch.h"
#include "launch_types.h"

namespace xkernels::cuda {

inline LogitsType logits_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return LogitsType::kFloat32;
    case at::kBFloat16: return LogitsType::kBFloat16;
    case at::kHalf: return LogitsType::kFloat16;
    default: TORCH_CHECK(false, "unsupported logits dtype ", t.scalar_type());
  }
}

// `bytes` of scratch on like's device.
inline at::Tensor workspace(size_t bytes, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

// dllm_step's rule (spiffy_accept's too) over rows of `vocab` ids; the view points into `s`.
inline DllmRule dllm_rule(int64_t mask_id, int64_t num_unmask, std::optional<double> threshold,
                          const SamplingArgs& s, int64_t vocab) {
  return DllmRule{mask_id,         num_unmask, threshold.has_value(), static_cast<float>(threshold.value_or(0.0)),
                  sampling_view(s), s.may_sample() && s.any_filter(vocab)};
}

inline cudaStream_t stream() { return at::cuda::getCurrentCUDAStream().stream(); }

// Raises, naming the op, if its launches failed.
inline void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace xkernels::cuda
