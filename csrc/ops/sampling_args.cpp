#include "sampling_args.h"

#include <ATen/ops/any.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/le.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/lt.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

#include "checks.h"

namespace xkernels {
namespace {

// A parameter given per row: a 1-D tensor of n elements on the device, converted to `dtype`.
at::Tensor per_row(const std::optional<at::Tensor>& t, const char* name, int64_t n, const at::Device& device,
                   std::initializer_list<at::ScalarType> dtypes, at::ScalarType dtype) {
  if (!t.has_value()) return at::Tensor();
  TORCH_CHECK(t->device() == device, name, " must be on ", device, " like the logits, got ", t->device());
  bool dtype_ok = false;
  for (auto d : dtypes) dtype_ok |= t->scalar_type() == d;
  TORCH_CHECK(dtype_ok, name, " must be a ", dtype, " tensor, got ", t->scalar_type());
  TORCH_CHECK(t->dim() == 1 && t->size(0) == n, name, " must have shape [N] = [", n, "], got ", t->sizes());
  if (dtype == at::kInt && t->scalar_type() == at::kLong)  // top_k beyond int32 keeps everything, as V < 2^31;
    // below it stays negative (invalid), not wrapped
    return t->clamp(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()).to(dtype).contiguous();
  return t->to(dtype).contiguous();
}

// seed or offset: an int, a one-element tensor (the scalar form, read on the device) or an [N]
// int64 tensor (per request). A one-element 1-D tensor is per request only when N is 1: it was
// the scalar form before per-request streams existed.
at::Tensor stream_tensor(const std::optional<at::Tensor>& t, const char* name, int64_t n, const at::Device& device,
                         bool& per_request) {
  if (!t.has_value()) return at::Tensor();
  TORCH_CHECK(t->device() == device, name, " must be on ", device, " like the logits, got ", t->device());
  TORCH_CHECK(t->scalar_type() == at::kLong, name, " must be an int64 tensor, got ", t->scalar_type());
  const bool scalar = t->dim() == 0 || (t->numel() == 1 && n != 1);
  TORCH_CHECK(scalar || (t->dim() == 1 && t->size(0) == n), name,
              " must be an int, a one-element tensor (one stream for the batch) or have shape [N] = [", n,
              "] (a stream per request), got shape ", t->sizes());
  per_request |= !scalar;
  return t->contiguous();
}

void check_values(const at::Tensor& bad, const char* what) {
  TORCH_CHECK(!bad.any().item<bool>(), what);
}

}  // namespace

SamplingArgs sampling_args(int64_t n, const at::Device& device, XK_SAMPLING_ARGS, std::string_view filter_order,
                           bool check_rows) {
  TORCH_CHECK(top_k >= 0, "top_k must be >= 0 (0: off), got ", top_k);
  TORCH_CHECK(top_p > 0.0 && top_p <= 1.0, "top_p must be in (0, 1] (1: off), got ", top_p);
  TORCH_CHECK(min_p >= 0.0 && min_p <= 1.0, "min_p must be in [0, 1] (0: off), got ", min_p);
  TORCH_CHECK(filter_order == "top_k_first" || filter_order == "min_p_first",
              "filter_order must be \"top_k_first\" or \"min_p_first\", got \"", filter_order, "\"");
  SamplingArgs s;
  s.n = n;
  s.scalar = RowSampling{inverse_temperature(temperature),
                         static_cast<int32_t>(std::min<int64_t>(top_k, std::numeric_limits<int32_t>::max())),
                         static_cast<float>(top_p), static_cast<float>(min_p), filter_order == "min_p_first"};
  s.temperature = per_row(temperature_tensor, "temperature", n, device, {at::kFloat}, at::kFloat);
  s.top_k = per_row(top_k_tensor, "top_k", n, device, {at::kInt, at::kLong}, at::kInt);
  s.top_p = per_row(top_p_tensor, "top_p", n, device, {at::kFloat}, at::kFloat);
  s.min_p = per_row(min_p_tensor, "min_p", n, device, {at::kFloat}, at::kFloat);
  s.seed = static_cast<uint64_t>(seed);
  s.offset = static_cast<uint64_t>(offset);
  s.per_request = false;
  s.seed_t = stream_tensor(seed_tensor, "seed", n, device, s.per_request);
  s.offset_t = stream_tensor(offset_tensor, "offset", n, device, s.per_request);
  if (check_rows && (device.is_cpu() || value_checks_enabled())) {
    if (s.temperature.defined())
      check_values(at::logical_or(at::logical_not(at::isfinite(s.temperature)), at::lt(s.temperature, 0)),
                   "temperature must be finite and >= 0 in every row");
    if (s.top_k.defined()) check_values(at::lt(s.top_k, 0), "top_k must be >= 0 (0: off) in every row");
    if (s.top_p.defined())
      check_values(at::logical_not(at::logical_and(at::gt(s.top_p, 0), at::le(s.top_p, 1))), "top_p must be in (0, 1] in every row");
    if (s.min_p.defined())
      check_values(at::logical_not(at::logical_and(at::ge(s.min_p, 0), at::le(s.min_p, 1))), "min_p must be in [0, 1] in every row");
  }
  return s;
}

void check_errors(const std::optional<at::Tensor>& errors, int64_t n) {
  if (!errors.has_value()) return;
  TORCH_CHECK(errors->scalar_type() == at::kInt, "errors must be int32, got ", errors->scalar_type());
  TORCH_CHECK(errors->dim() == 1 && errors->size(0) == n, "errors must have shape [N] = [", n, "], got ",
              errors->sizes());
  TORCH_CHECK(errors->is_contiguous(), "errors must be contiguous");
}

SamplingView sampling_view(const SamplingArgs& s) {
  const auto ptr = [](const at::Tensor& t, auto* type) -> decltype(type) {
    return t.defined() ? t.const_data_ptr<std::remove_const_t<std::remove_pointer_t<decltype(type)>>>() : nullptr;
  };
  SamplingView v{};
  v.scalar = s.scalar;
  v.temperature = ptr(s.temperature, static_cast<const float*>(nullptr));
  v.top_k = ptr(s.top_k, static_cast<const int32_t*>(nullptr));
  v.top_p = ptr(s.top_p, static_cast<const float*>(nullptr));
  v.min_p = ptr(s.min_p, static_cast<const float*>(nullptr));
  v.seed = s.seed, v.offset = s.offset;
  v.seed_ptr = ptr(s.seed_t, static_cast<const int64_t*>(nullptr));
  v.offset_ptr = ptr(s.offset_t, static_cast<const int64_t*>(nullptr));
  // Otherwise one element, read at 0: the scalar form (or N = 1).
  v.seed_per_row = s.seed_t.defined() && s.seed_t.dim() == 1 && s.seed_t.numel() == s.n;
  v.offset_per_row = s.offset_t.defined() && s.offset_t.dim() == 1 && s.offset_t.numel() == s.n;
  v.per_request = s.per_request;
  return v;
}

}  // namespace xkernels
