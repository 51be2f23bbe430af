// chain_verify: the C++ API (through the dispatcher) and the argument checks
// both kernels run.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <limits>

#include "checks.h"
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
  TORCH_CHECK(draft_tokens.device() == target_logits.device(), "draft_tokens must be on ", target_logits.device(),
              " like target_logits, got ", draft_tokens.device());
  inverse_temperature(temperature);  // checks the range
  if (draft_probs.has_value()) {
    const auto& q = *draft_probs;
    TORCH_CHECK(q.scalar_type() == at::kFloat, "draft_probs must be float32, got ", q.scalar_type());
    TORCH_CHECK(q.dim() == 3 && q.size(0) == n && q.size(1) == k && q.size(2) == v,
                "draft_probs must have shape [N, K, V] = [", n, ", ", k, ", ", v, "], got ", q.sizes());
    TORCH_CHECK(q.device() == target_logits.device(), "draft_probs must be on ", target_logits.device(),
                " like target_logits, got ", q.device());
  }
  return ChainVerifyShape{n, k, v};
}

}  // namespace xkernels
