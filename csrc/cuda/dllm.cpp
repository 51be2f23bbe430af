// dllm_step on CUDA: checks, allocation and the launches on the current stream (with `errors`, first
// param_errors_kernel's).
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/checks.h"
#include "binding.h"
#include "dllm_launch.h"
#include "param_errors_binding.h"

namespace xkernels {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dllm_step_cuda(
    const at::Tensor& logits, const at::Tensor& block_tokens, int64_t mask_id, int64_t num_unmask,
    std::optional<double> threshold, XK_SAMPLING_ARGS, const std::optional<at::Tensor>& errors,
    std::string_view filter_order) {
  check_devices(logits, "logits", {{errors, "errors"}});  // first, as the op's own tensors
  const auto s = check_dllm_step(logits, block_tokens, num_unmask, threshold);
  if (value_checks_enabled()) check_block_tokens(block_tokens, mask_id, s.v);
  check_errors(errors, s.n);
  const SamplingArgs sampling =
      sampling_args(s.n, logits.device(), XK_SAMPLING_FORWARD, filter_order, !errors.has_value());
  const c10::cuda::CUDAGuard guard(logits.device());
  cuda::flag_param_errors(sampling, errors, "dllm_step");
  const auto l = logits.contiguous();
  auto [block, new_block, positions, tokens, confidence] = dllm_outputs(logits, block_tokens, s);
  cuda::DllmParams p{};
  p.logits = l.const_data_ptr();
  p.dtype = cuda::logits_type(l);
  p.block = block.const_data_ptr<int64_t>();
  p.n = s.n, p.l = s.l, p.v = s.v;
  p.rule = cuda::dllm_rule(mask_id, num_unmask, threshold, sampling, s.v);
  p.new_block = new_block.mutable_data_ptr<int64_t>();
  p.positions = positions.mutable_data_ptr<int64_t>();
  p.tokens = tokens.mutable_data_ptr<int64_t>();
  p.confidence = confidence.mutable_data_ptr<float>();
  p.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  auto workspace = cuda::workspace(cuda::dllm_workspace_bytes(p), l);
  cuda::check_launch(cuda::launch_dllm_step(p, workspace.mutable_data_ptr(), cuda::stream()), "dllm_step");
  return {new_block, positions, tokens, confidence};
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CUDA, m) { m.impl("dllm_step", &dllm_step_cuda); }

}  // namespace xkernels
