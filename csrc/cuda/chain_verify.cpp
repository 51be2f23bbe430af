// chain_verify on CUDA: checks, allocation and the launch on the current stream.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/checks.h"
#include "binding.h"
#include "chain_verify_launch.h"

namespace xkernels {
namespace {

std::tuple<at::Tensor, at::Tensor> chain_verify_cuda(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                                     const std::optional<at::Tensor>& draft_probs, double temperature,
                                                     int64_t seed, int64_t offset,
                                                     const std::optional<at::Tensor>& seed_tensor,
                                                     const std::optional<at::Tensor>& offset_tensor) {
  const auto shape = check_chain_verify(draft_tokens, target_logits, draft_probs, temperature);
  if (value_checks_enabled()) check_token_ids(draft_tokens, shape.v, "draft_tokens");
  const RngArgs rng = rng_args(seed, offset, seed_tensor, offset_tensor, target_logits.device());
  const c10::cuda::CUDAGuard guard(target_logits.device());

  const auto logits = target_logits.contiguous();
  const auto draft = draft_tokens.contiguous();
  const auto q = draft_probs.has_value() ? draft_probs->contiguous() : at::Tensor();
  auto accept_len = at::empty({shape.n}, draft_tokens.options());
  auto out = at::empty({shape.n, shape.k + 1}, draft_tokens.options());
  if (shape.n == 0) return {accept_len, out};

  cuda::ChainVerifyParams p{};
  p.logits = logits.const_data_ptr();
  p.dtype = cuda::logits_type(logits);
  p.draft = draft.const_data_ptr<int64_t>();
  p.q = q.defined() ? q.const_data_ptr() : nullptr;
  p.q_dtype = q.defined() ? cuda::logits_type(q) : cuda::LogitsType::kFloat32;  // checked dtype
  p.n = shape.n, p.k = shape.k, p.v = shape.v;
  p.inv_t = inverse_temperature(temperature);
  p.seed = rng.seed, p.offset = rng.offset;
  p.seed_ptr = rng.seed_ptr, p.offset_ptr = rng.offset_ptr;
  p.accept_len = accept_len.mutable_data_ptr<int64_t>();
  p.out_tokens = out.mutable_data_ptr<int64_t>();
  p.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;

  auto workspace = cuda::workspace(cuda::chain_verify_workspace_bytes(p), target_logits);
  cuda::check_launch(cuda::launch_chain_verify(p, workspace.mutable_data_ptr(), cuda::stream()), "chain_verify");
  return {accept_len, out};
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CUDA, m) { m.impl("chain_verify", &chain_verify_cuda); }

}  // namespace xkernels
