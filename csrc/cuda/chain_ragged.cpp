// chain_verify_ragged_ on CUDA: checks and the launch on the current stream, no host sync (value
// checks of cu_num_draft_tokens, the draft ids and the per-row parameters run only with
// XKERNELS_CHECK=1, the last never with `errors`, which the kernel flags them into; the kernel
// stays memory-safe without them).
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/chain_verify_ragged.h"
#include "binding.h"
#include "chain_ragged_launch.h"

namespace xkernels {
namespace {

void chain_verify_ragged_cuda(const at::Tensor& draft_tokens, const at::Tensor& cu_num_draft_tokens,
                              const at::Tensor& target_logits, int64_t max_spec_len,
                              const std::optional<at::Tensor>& draft_probs, XK_SAMPLING_ARGS, bool block,
                              const at::Tensor& output_token_ids, const at::Tensor& num_emitted,
                              const std::optional<at::Tensor>& logprobs, const std::optional<at::Tensor>& errors,
                              std::string_view filter_order) {
  const auto shape = check_chain_verify_ragged(draft_tokens, cu_num_draft_tokens, target_logits, max_spec_len,
                                               draft_probs, output_token_ids, num_emitted, logprobs, errors);
  const SamplingArgs s =
      sampling_args(shape.n, target_logits.device(), XK_SAMPLING_FORWARD, filter_order, !errors.has_value());
  if (shape.n == 0) return;
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const auto logits = target_logits.contiguous();
  const auto draft = draft_tokens.to(at::kLong).contiguous();
  const auto cu = cu_num_draft_tokens.to(at::kLong).contiguous();
  const auto q = draft_probs.has_value() ? draft_probs->contiguous() : at::Tensor();

  cuda::ChainRaggedParams p{};
  p.logits = logits.const_data_ptr();
  p.dtype = cuda::logits_type(logits);
  p.draft = draft.const_data_ptr<int64_t>();
  p.cu = cu.const_data_ptr<int64_t>();
  p.q = q.defined() ? q.const_data_ptr() : nullptr;
  p.q_dtype = q.defined() ? cuda::logits_type(q) : cuda::LogitsType::kFloat32;  // checked dtype
  p.t = shape.t, p.n = shape.n, p.v = shape.v, p.max_spec_len = shape.max_spec_len;
  p.s = sampling_view(s);
  p.block = block;
  p.out = output_token_ids.mutable_data_ptr<int32_t>();
  p.num_emitted = num_emitted.mutable_data_ptr<int32_t>();
  p.logprobs = logprobs.has_value() ? logprobs->mutable_data_ptr<float>() : nullptr;  // null: not computed
  p.errors = errors.has_value() ? errors->mutable_data_ptr<int32_t>() : nullptr;
  auto workspace = cuda::workspace(cuda::chain_ragged_workspace_bytes(p), target_logits);
  cuda::check_launch(cuda::launch_chain_ragged(p, workspace.mutable_data_ptr(), cuda::stream()), "chain_verify_ragged");
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CUDA, m) { m.impl("chain_verify_ragged_", &chain_verify_ragged_cuda); }

}  // namespace xkernels
