// dllm_step: the C++ API (through the dispatcher) and the argument checks both kernels run.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/any.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/ne.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

#include "checks.h"
#include "sampling_args.h"
#include "xkernels/ops.h"

namespace xkernels {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dllm_step(
    const at::Tensor& logits, const at::Tensor& block_tokens, int64_t mask_id, int64_t num_unmask,
    std::optional<double> threshold, const Sampling& sampling, const std::optional<at::Tensor>& errors) {
  using T = at::Tensor;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("xkernels::dllm_step", "")
                       .typed<std::tuple<T, T, T, T>(const T&, const T&, int64_t, int64_t, std::optional<double>,
                                                     XK_SAMPLING_TYPES, const std::optional<T>&, std::string_view)>();
  return op.call(logits, block_tokens, mask_id, num_unmask, threshold, XK_SAMPLING_OF(sampling), errors,
                 sampling.filter_order);
}

DllmShape check_dllm_step(const at::Tensor& logits, const at::Tensor& block_tokens, int64_t num_unmask,
                          std::optional<double> threshold, const char* logits_name) {
  check_devices(logits, logits_name, {{block_tokens, "block_tokens"}});
  TORCH_CHECK(logits.dim() == 3, logits_name, " must have shape [N, L, V], got ", logits.sizes());
  const auto dt = logits.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf, logits_name,
              " must be float32, bfloat16 or float16, got ", dt);
  TORCH_CHECK(block_tokens.scalar_type() == at::kLong, "block_tokens must be int64, got ", block_tokens.scalar_type());
  TORCH_CHECK(block_tokens.dim() == 2 && block_tokens.size(0) == logits.size(0) &&
                  block_tokens.size(1) == logits.size(1),
              "block_tokens must have shape [N, L] = [", logits.size(0), ", ", logits.size(1), "], got ",
              block_tokens.sizes());
  const int64_t v = logits.size(2);
  TORCH_CHECK(v > 0 && v < std::numeric_limits<int32_t>::max(), logits_name, " vocabulary V must be in [1, 2^31)");
  TORCH_CHECK(logits.size(1) < std::numeric_limits<int32_t>::max(), logits_name, ": L must be below 2^31");
  TORCH_CHECK(num_unmask >= 1, "num_unmask must be >= 1, got ", num_unmask);
  TORCH_CHECK(!threshold.has_value() || std::isfinite(*threshold), "threshold must be finite, got ",
              threshold.value_or(0.0));
  return DllmShape{logits.size(0), logits.size(1), v};
}

void check_block_tokens(const at::Tensor& block_tokens, int64_t mask_id, int64_t vocab) {
  if (block_tokens.numel() == 0) return;
  const auto outside = at::logical_or(at::lt(block_tokens, 0), at::ge(block_tokens, vocab));
  TORCH_CHECK(!at::logical_and(outside, at::ne(block_tokens, mask_id)).any().item<bool>(),
              "block_tokens holds ids outside [0, ", vocab, ") other than mask_id = ", mask_id);
}

DllmOutputs dllm_outputs(const at::Tensor& logits, const at::Tensor& block_tokens, const DllmShape& s) {
  DllmOutputs o;
  o.block = block_tokens.contiguous();
  o.new_block = o.block.clone();
  o.positions = at::full({s.n, s.l}, -1, o.block.options());
  o.tokens = at::full({s.n, s.l}, -1, o.block.options());
  o.confidence = at::empty({s.n, s.l}, logits.options().dtype(at::kFloat));
  return o;
}

}  // namespace xkernels
