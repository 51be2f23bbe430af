#include "checks.h"

#include <ATen/ops/any.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/lt.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace xkernels {

bool value_checks_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("XKERNELS_CHECK");
    return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
  }();
  return enabled;
}

void check_devices(const at::Tensor& like, const char* like_name, std::initializer_list<Arg> args) {
  // An undefined tensor (None where the schema takes a Tensor) has no device to compare.
  TORCH_CHECK(like.defined(), like_name, " must be a tensor, got None");
  for (const Arg& a : args) {
    if (a.tensor == nullptr) continue;
    TORCH_CHECK(a.tensor->defined(), a.name, " must be a tensor, got None");
    TORCH_CHECK(a.tensor->device() == like.device(), a.name, " must be on ", like.device(), " like ", like_name,
                ", got ", a.tensor->device());
  }
}

at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options, const std::string& sized_by) {
  try {
    return at::empty(sizes, options);
  } catch (const c10::Error& e) {
    C10_THROW_ERROR(OutOfMemoryError, c10::str(sized_by, " asks for an output of shape ", sizes, " (",
                                               options.dtype(), ") that cannot be allocated: ",
                                               e.what_without_backtrace()));
  }
}

static const int64_t* rng_tensor_ptr(const std::optional<at::Tensor>& t, const char* name,
                                     const at::Device& device) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->device() == device, name, " must be on ", device, " like the logits, got ", t->device());
  TORCH_CHECK(t->scalar_type() == at::kLong, name, " must be an int64 tensor, got ", t->scalar_type());
  TORCH_CHECK(t->numel() == 1, name, " must hold exactly one element, got shape ", t->sizes());
  return t->const_data_ptr<int64_t>();
}

RngArgs rng_args(int64_t seed, int64_t offset, const std::optional<at::Tensor>& seed_tensor,
                 const std::optional<at::Tensor>& offset_tensor, const at::Device& device) {
  return RngArgs{static_cast<uint64_t>(seed), static_cast<uint64_t>(offset),
                 rng_tensor_ptr(seed_tensor, "seed", device), rng_tensor_ptr(offset_tensor, "offset", device)};
}

float inverse_temperature(double temperature) {
  TORCH_CHECK(std::isfinite(temperature) && temperature >= 0.0, "temperature must be finite and >= 0, got ",
              temperature);
  if (temperature == 0.0) return 0.0f;
  const float inv = static_cast<float>(1.0 / temperature);
  return std::isfinite(inv) ? inv : 0.0f;
}

void check_token_ids(const at::Tensor& tokens, int64_t vocab, const char* name) {
  if (tokens.numel() == 0) return;
  const bool bad = at::logical_or(at::lt(tokens, 0), at::ge(tokens, vocab)).any().item<bool>();
  TORCH_CHECK(!bad, name, " holds ids outside [0, ", vocab, ")");
}

void check_probs_dtype(const at::Tensor& probs, const char* name) {
  const auto dt = probs.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf, name,
              " must be float32, bfloat16 or float16, got ", dt);
}

at::Tensor cut_ids_int32(const at::Tensor& ids) {
  return ids.clamp(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()).to(at::kInt).contiguous();
}

void check_shard_logits(const at::Tensor& logits, int64_t vocab_start) {
  const auto dt = logits.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
              "logits must be float32, bfloat16 or float16, got ", dt);
  const int64_t v = logits.size(-1);
  TORCH_CHECK(vocab_start >= 0, "vocab_start must be >= 0, got ", vocab_start);
  TORCH_CHECK(vocab_start < std::numeric_limits<int32_t>::max() - v, "vocab_start + V_local (logits' last size) = ",
              vocab_start, " + ", v, " is too large (the global vocabulary must stay below 2^31)");
}

}  // namespace xkernels
