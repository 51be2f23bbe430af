// chain_verify: the C++ API (through the dispatcher) and the argument checks
// both kernels run.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <ATen/ops/any.h>
#include <ATen/ops/diff.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/max.h>

#include <limits>

#include "checks.h"
#include "chain_verify_ragged.h"
#include "xkernels/ops.h"

namespace xkernels {

std::tuple<at::Tensor, at::Tensor> chain_verify(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                                const std::optional<at::Tensor>& draft_probs, double temperature,
                                                int64_t seed, int64_t offset,
                                                const std::optional<at::Tensor>& seed_tensor,
                                                const std::optional<at::Tensor>& offset_tensor) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("xkernels::chain_verify", "")
                       .typed<decltype(chain_verify)>();
  return op.call(draft_tokens, target_logits, draft_probs, temperature, seed, offset, seed_tensor, offset_tensor);
}

ChainVerifyShape check_chain_verify(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                    const std::optional<at::Tensor>& draft_probs, double temperature) {
  check_devices(target_logits, "target_logits", {{draft_tokens, "draft_tokens"}, {draft_probs, "draft_probs"}});
  TORCH_CHECK(draft_tokens.dim() == 2, "draft_tokens must have shape [N, K], got ", draft_tokens.sizes());
  TORCH_CHECK(draft_tokens.scalar_type() == at::kLong, "draft_tokens must be int64, got ",
              draft_tokens.scalar_type());
  TORCH_CHECK(target_logits.dim() == 3, "target_logits must have shape [N, K+1, V], got ", target_logits.sizes());
  const auto dt = target_logits.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
              "target_logits must be float32, bfloat16 or float16, got ", dt);
  const int64_t n = draft_tokens.size(0), k = draft_tokens.size(1), v = target_logits.size(2);
  TORCH_CHECK(target_logits.size(0) == n && target_logits.size(1) == k + 1, "target_logits must have shape [N, K+1, V] = [",
              n, ", ", k + 1, ", V] to match draft_tokens ", draft_tokens.sizes(), ", got ", target_logits.sizes());
  TORCH_CHECK(v > 0, "target_logits must have a non-empty vocabulary (V > 0)");
  TORCH_CHECK(v < std::numeric_limits<int32_t>::max(), "target_logits vocabulary V=", v, " is too large (V < 2^31)");
  inverse_temperature(temperature);  // checks the range
  if (draft_probs.has_value()) {
    const auto& q = *draft_probs;
    check_probs_dtype(q, "draft_probs");
    TORCH_CHECK(q.dim() == 3 && q.size(0) == n && q.size(1) == k && q.size(2) == v,
                "draft_probs must have shape [N, K, V] = [", n, ", ", k, ", ", v, "], got ", q.sizes());
  }
  return ChainVerifyShape{n, k, v};
}

void chain_verify_ragged_(const at::Tensor& draft_tokens, const at::Tensor& cu_num_draft_tokens,
                          const at::Tensor& target_logits, int64_t max_spec_len,
                          const std::optional<at::Tensor>& draft_probs, const Sampling& sampling, bool block,
                          const at::Tensor& output_token_ids, const at::Tensor& num_emitted,
                          const std::optional<at::Tensor>& logprobs, const std::optional<at::Tensor>& errors) {
  using T = at::Tensor;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("xkernels::chain_verify_ragged_", "")
                       .typed<void(const T&, const T&, const T&, int64_t, const std::optional<T>&, XK_SAMPLING_TYPES,
                                   bool, const T&, const T&, const std::optional<T>&, const std::optional<T>&,
                                   std::string_view)>();
  op.call(draft_tokens, cu_num_draft_tokens, target_logits, max_spec_len, draft_probs, XK_SAMPLING_OF(sampling), block,
          output_token_ids, num_emitted, logprobs, errors, sampling.filter_order);
}

RaggedShape check_chain_verify_ragged(const at::Tensor& draft_tokens, const at::Tensor& cu_num_draft_tokens,
                                      const at::Tensor& target_logits, int64_t max_spec_len,
                                      const std::optional<at::Tensor>& draft_probs,
                                      const at::Tensor& output_token_ids, const at::Tensor& num_emitted,
                                      const std::optional<at::Tensor>& logprobs,
                                      const std::optional<at::Tensor>& errors) {
  check_devices(target_logits, "target_logits",
                {{draft_tokens, "draft_tokens"}, {cu_num_draft_tokens, "cu_num_draft_tokens"},
                 {draft_probs, "draft_probs"}, {output_token_ids, "output_token_ids"}, {num_emitted, "num_emitted"},
                 {logprobs, "logprobs"}, {errors, "errors"}});
  const auto device = target_logits.device();
  TORCH_CHECK(draft_tokens.dim() == 1, "draft_tokens must have shape [T], got ", draft_tokens.sizes());
  TORCH_CHECK(draft_tokens.scalar_type() == at::kLong || draft_tokens.scalar_type() == at::kInt,
              "draft_tokens must be int64 or int32, got ", draft_tokens.scalar_type());
  TORCH_CHECK(cu_num_draft_tokens.dim() == 1, "cu_num_draft_tokens must have shape [N], got ",
              cu_num_draft_tokens.sizes());
  TORCH_CHECK(cu_num_draft_tokens.scalar_type() == at::kLong || cu_num_draft_tokens.scalar_type() == at::kInt,
              "cu_num_draft_tokens must be int32 or int64, got ", cu_num_draft_tokens.scalar_type());
  TORCH_CHECK(target_logits.dim() == 2, "target_logits must have shape [T + N, V], got ", target_logits.sizes());
  const auto dt = target_logits.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
              "target_logits must be float32, bfloat16 or float16, got ", dt);
  const int64_t t = draft_tokens.size(0), n = cu_num_draft_tokens.size(0), v = target_logits.size(1);
  TORCH_CHECK(target_logits.size(0) == t + n, "target_logits must have T + N = ", t + n,
              " rows (T drafts, N requests), got ", target_logits.sizes());
  TORCH_CHECK(v > 0, "target_logits must have a non-empty vocabulary (V > 0)");
  TORCH_CHECK(v < std::numeric_limits<int32_t>::max(), "target_logits vocabulary V=", v, " is too large (V < 2^31)");
  TORCH_CHECK(max_spec_len >= 0, "max_spec_len must be >= 0, got ", max_spec_len);
  if (draft_probs.has_value()) {
    const auto& q = *draft_probs;
    check_probs_dtype(q, "draft_probs");
    TORCH_CHECK(q.dim() == 2 && q.size(0) == t && q.size(1) == v, "draft_probs must have shape [T, V] = [", t, ", ",
                v, "], got ", q.sizes());
  }
  const auto buffer = [&](const at::Tensor& b, const char* name, at::ScalarType dtype, at::IntArrayRef shape) {
    TORCH_CHECK(b.scalar_type() == dtype, name, " must be ", dtype, ", got ", b.scalar_type());
    TORCH_CHECK(b.sizes() == shape, name, " must have shape ", shape, ", got ", b.sizes());
    TORCH_CHECK(b.is_contiguous(), name, " must be contiguous");
  };
  buffer(output_token_ids, "output_token_ids", at::kInt, {n, max_spec_len + 1});
  buffer(num_emitted, "num_emitted", at::kInt, {n});
  if (logprobs.has_value()) buffer(*logprobs, "logprobs", at::kFloat, {n, max_spec_len + 1});
  check_errors(errors, n);  // the same check as every other op with the flag
  if ((device.is_cpu() || value_checks_enabled()) && n > 0) {
    const auto cu = cu_num_draft_tokens.to(at::kLong);
    const auto counts = at::diff(cu, 1, 0, cu.new_zeros({1}));
    TORCH_CHECK(!at::lt(counts, 0).any().item<bool>(), "cu_num_draft_tokens must not decrease (and start >= 0)");
    TORCH_CHECK(cu[-1].item<int64_t>() == t, "cu_num_draft_tokens must end at T = ", t, " (the drafts), got ",
                cu[-1].item<int64_t>());
    TORCH_CHECK(!at::gt(counts, max_spec_len).any().item<bool>(), "max_spec_len=", max_spec_len,
                " is below a request's number of drafts (", counts.max().item<int64_t>(), ")");
    check_token_ids(draft_tokens, v, "draft_tokens");
  }
  return RaggedShape{t, n, v, max_spec_len};
}

}  // namespace xkernels
