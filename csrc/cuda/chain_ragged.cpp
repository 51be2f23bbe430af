// chain_verify_ragged_ on CUDA: checks and the launch on the current stream, no host sync (value
// checks of cu_num_draft_tokens, the draft ids and the per-row parameters run only with
// XKERNELS_CHECK=1; the kernel stays memory-safe without them).
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
                              const at::Tensor& logprobs) {
  const auto shape = check_chain_verify_ragged(draft_tokens, cu_num_draft_tokens, target_logits, max_spec_len,
                                               draft_probs, output_token_ids, num_emitted, logprobs);
  const SamplingArgs s = sampling_args(shape.n, target_logits.device(), XK_SAMPLING_FORWARD);
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
  p.q = q.defined() ? q.const_data_ptr<float>() : nullptr;
  p.t = shape.t, p.n = shape.n, p.v = shape.v, p.max_spec_len = shape.max_spec_len;
  p.scalar = s.scalar;
  p.temperature = s.temperature.defined() ? s.temperature.const_data_ptr<float>() : nullptr;
  p.top_k = s.top_k.defined() ? s.top_k.const_data_ptr<int32_t>() : nullptr;
  p.top_p = s.top_p.defined() ? s.top_p.const_data_ptr<float>() : nullptr;
  p.min_p = s.min_p.defined() ? s.min_p.const_data_ptr<float>() : nullptr;
  p.seed = s.seed, p.offset = s.offset;
  p.seed_ptr = s.seed_t.defined() ? s.seed_t.const_data_ptr<int64_t>() : nullptr;
  p.offset_ptr = s.offset_t.defined() ? s.offset_t.const_data_ptr<int64_t>() : nullptr;
  p.seed_per_row = s.seed_t.defined() && s.per_request && s.seed_t.dim() == 1 && s.seed_t.numel() == shape.n;
  p.offset_per_row = s.offset_t.defined() && s.per_request && s.offset_t.dim() == 1 && s.offset_t.numel() == shape.n;
  p.per_request = s.per_request;
  p.block = block;
  p.out = output_token_ids.mutable_data_ptr<int32_t>();
  p.num_emitted = num_emitted.mutable_data_ptr<int32_t>();
  p.logprobs = logprobs.mutable_data_ptr<float>();
  cuda::check_launch(cuda::launch_chain_ragged(p, cuda::stream()), "chain_verify_ragged");
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CUDA, m) { m.impl("chain_verify_ragged_", &chain_verify_ragged_cuda); }

}  // namespace xkernels
