// refine_step, jacobi_refine, sequential_refine: the C++ API (through the
// dispatcher) and the argument checks both kernels run.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <limits>

#include "checks.h"
#include "sampling_args.h"
#include "xkernels/ops.h"

namespace xkernels {

template <typename Signature>
static auto typed_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

using T = at::Tensor;
using Opt = std::optional<at::Tensor>;

std::tuple<at::Tensor, at::Tensor> refine_step(const at::Tensor& ctx, const at::Tensor& prev_tokens,
                                               const at::Tensor& base_logits, const RefinerWeights& w,
                                               const Sampling& sampling, const std::optional<at::Tensor>& errors) {
  static auto op = typed_op<std::tuple<T, T>(const T&, const T&, const T&, const T&, const T&, const T&, const T&,
                                             const T&, const T&, XK_SAMPLING_TYPES, const Opt&, std::string_view)>(
      "xkernels::refine_step");
  return op.call(ctx, prev_tokens, base_logits, w.emb, w.mix, w.w_gate, w.w_up, w.w_down, w.w_read,
                 XK_SAMPLING_OF(sampling), errors, sampling.filter_order);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> jacobi_refine(const at::Tensor& ctx, const at::Tensor& prefix_tokens,
                                                             const at::Tensor& base_logits, const RefinerWeights& w,
                                                             int64_t max_iters, const Sampling& sampling,
                                                             const std::optional<at::Tensor>& errors) {
  static auto op =
      typed_op<std::tuple<T, T, T>(const T&, const T&, const T&, const T&, const T&, const T&, const T&, const T&,
                                   const T&, int64_t, XK_SAMPLING_TYPES, const Opt&, std::string_view)>(
          "xkernels::jacobi_refine");
  return op.call(ctx, prefix_tokens, base_logits, w.emb, w.mix, w.w_gate, w.w_up, w.w_down, w.w_read, max_iters,
                 XK_SAMPLING_OF(sampling), errors, sampling.filter_order);
}

std::tuple<at::Tensor, at::Tensor> sequential_refine(const at::Tensor& ctx, const at::Tensor& prefix_tokens,
                                                     const at::Tensor& base_logits, const RefinerWeights& w,
                                                     const Sampling& sampling,
                                                     const std::optional<at::Tensor>& errors) {
  static auto op = typed_op<std::tuple<T, T>(const T&, const T&, const T&, const T&, const T&, const T&, const T&,
                                             const T&, const T&, XK_SAMPLING_TYPES, const Opt&, std::string_view)>(
      "xkernels::sequential_refine");
  return op.call(ctx, prefix_tokens, base_logits, w.emb, w.mix, w.w_gate, w.w_up, w.w_down, w.w_read,
                 XK_SAMPLING_OF(sampling), errors, sampling.filter_order);
}

static void check_weight(const at::Tensor& t, const char* name, std::initializer_list<int64_t> shape,
                         const char* shape_text, const at::Tensor& like) {
  TORCH_CHECK(t.dim() == static_cast<int64_t>(shape.size()) && t.sizes().equals(shape), name, " must have shape ",
              shape_text, " = ", at::IntArrayRef(shape), ", got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, " must have the dtype of w_read (", like.scalar_type(),
              "), got ", t.scalar_type());
}

RefineShape check_refine(const at::Tensor& ctx, const at::Tensor& tokens, const char* tokens_name,
                         bool tokens_are_prefix, const at::Tensor& base_logits, const at::Tensor& emb,
                         const at::Tensor& mix, const at::Tensor& w_gate, const at::Tensor& w_up,
                         const at::Tensor& w_down, const at::Tensor& w_read, double temperature) {
  check_devices(ctx, "ctx", {{base_logits, "base_logits"}, {w_read, "w_read"}, {emb, "emb"}, {mix, "mix"},
                             {w_gate, "w_gate"}, {w_up, "w_up"}, {w_down, "w_down"}, {tokens, tokens_name}});
  TORCH_CHECK(ctx.dim() == 3, "ctx must have shape [N, B, r], got ", ctx.sizes());
  TORCH_CHECK(ctx.scalar_type() == at::kFloat, "ctx must be float32, got ", ctx.scalar_type());
  TORCH_CHECK(base_logits.dim() == 3, "base_logits must have shape [N, D, V], got ", base_logits.sizes());
  const auto dt = base_logits.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
              "base_logits must be float32, bfloat16 or float16, got ", dt);
  TORCH_CHECK(w_read.dim() == 2, "w_read must have shape [V, r], got ", w_read.sizes());
  TORCH_CHECK(w_read.scalar_type() == at::kFloat || w_read.scalar_type() == at::kBFloat16,
              "w_read must be float32 or bfloat16, got ", w_read.scalar_type());
  TORCH_CHECK(w_gate.dim() == 2, "w_gate must have shape [H, r], got ", w_gate.sizes());
  RefineShape s;
  s.n = ctx.size(0), s.b = ctx.size(1), s.r = ctx.size(2);
  s.d = base_logits.size(1), s.v = base_logits.size(2), s.h = w_gate.size(0);
  s.f = s.b - s.d;
  TORCH_CHECK(base_logits.size(0) == s.n, "base_logits must have N=", s.n, " sequences like ctx, got ",
              base_logits.sizes());
  TORCH_CHECK(s.d >= 1 && s.d <= s.b, "base_logits must have between 1 and B=", s.b, " drafted slots, got D=", s.d);
  TORCH_CHECK(s.v > 0 && s.v < std::numeric_limits<int32_t>::max(), "base_logits vocabulary V=", s.v,
              " must be in [1, 2^31)");
  TORCH_CHECK(s.r > 0 && s.h > 0, "ctx's rank r (its last dimension) and w_gate's SwiGLU width H (its first) must be "
              "positive, got r = ", s.r, ", H = ", s.h);
  check_weight(w_read, "w_read", {s.v, s.r}, "[V, r]", w_read);
  check_weight(emb, "emb", {s.v, s.r}, "[V, r]", w_read);
  check_weight(mix, "mix", {s.r, s.b, s.b}, "[r, B, B]", w_read);
  check_weight(w_gate, "w_gate", {s.h, s.r}, "[H, r]", w_read);
  check_weight(w_up, "w_up", {s.h, s.r}, "[H, r]", w_read);
  check_weight(w_down, "w_down", {s.r, s.h}, "[r, H]", w_read);
  const int64_t len = tokens_are_prefix ? s.f + 1 : s.b;
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == s.n && tokens.size(1) == len, tokens_name,
              " must have shape ", tokens_are_prefix ? "[N, F+1] = [" : "[N, B] = [", s.n, ", ", len, "], got ",
              tokens.sizes());
  TORCH_CHECK(tokens.scalar_type() == at::kLong, tokens_name, " must be int64, got ", tokens.scalar_type());
  inverse_temperature(temperature);  // checks the range
  return s;
}

}  // namespace xkernels
