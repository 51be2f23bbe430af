// Per-request sampling arguments of the verification ops: temperature, top_k, top_p and min_p as a
// scalar or an [N] tensor each, and seed and offset as the scalar stream or [N] per-request ones.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "xkernels/sampling_params.h"

namespace xkernels {

// The arguments as the schemas list them.
#define XK_SAMPLING_ARGS                                                                                     \
  double temperature, const std::optional<at::Tensor>&temperature_tensor, int64_t top_k,                   \
      const std::optional<at::Tensor>&top_k_tensor, double top_p, const std::optional<at::Tensor>&top_p_tensor, \
      double min_p, const std::optional<at::Tensor>&min_p_tensor, int64_t seed,                             \
      const std::optional<at::Tensor>&seed_tensor, int64_t offset, const std::optional<at::Tensor>&offset_tensor
#define XK_SAMPLING_FORWARD                                                                                  \
  temperature, temperature_tensor, top_k, top_k_tensor, top_p, top_p_tensor, min_p, min_p_tensor, seed,    \
      seed_tensor, offset, offset_tensor
// Their types (a typed dispatcher call's), and a C++ API Sampling `s` passed as them.
#define XK_SAMPLING_TYPES                                                                                    \
  double, const std::optional<at::Tensor>&, int64_t, const std::optional<at::Tensor>&, double,             \
      const std::optional<at::Tensor>&, double, const std::optional<at::Tensor>&, int64_t,                 \
      const std::optional<at::Tensor>&, int64_t, const std::optional<at::Tensor>&
#define XK_SAMPLING_OF(s)                                                                                    \
  (s).temperature, (s).temperature_tensor, (s).top_k, (s).top_k_tensor, (s).top_p, (s).top_p_tensor,        \
      (s).min_p, (s).min_p_tensor, (s).seed, (s).seed_tensor, (s).offset, (s).offset_tensor

// Checked arguments of n rows on one device. Per-row tensors are held contiguous, in one dtype
// each (float32 temperatures, top_p and min_p, int32 top_k, int64 seeds and offsets).
struct SamplingArgs {
  int64_t n;
  RowSampling scalar;  // where no tensor is given
  at::Tensor temperature, top_k, top_p, min_p;
  uint64_t seed, offset;
  at::Tensor seed_t, offset_t;  // [N] (per request) or one element (the scalar form, read on the device)
  bool per_request;

  // Whether any row may sample (a per-row temperature counts as one that may).
  bool may_sample() const { return temperature.defined() || scalar.inv_t != 0.0f; }
  bool any_filter(int64_t vocab) const {
    return top_k.defined() || top_p.defined() || min_p.defined() || filters_active(scalar, vocab);
  }
};

// Checks shapes, dtypes and devices (and, on the CPU or with XKERNELS_CHECK=1, the values: a
// temperature finite and >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1]), naming the argument.
// The scalars' values always; the per-row tensors' only with check_rows (false: the op flags them
// instead, xkernels/param_errors.h). filter_order, the schemas' last argument (after errors, so not
// in the macros): "top_k_first" or "min_p_first" (vLLM's), set in scalar, which every row starts from.
SamplingArgs sampling_args(int64_t n, const at::Device& device, XK_SAMPLING_ARGS, std::string_view filter_order,
                           bool check_rows = true);

// The asynchronous error flag's buffer (an op's `errors`), when given: int32 [n], contiguous, each
// message naming it (its device: the op's check_devices, first). An op given one flags its per-row
// values (xkernels/param_errors.h) instead of raising: it passes check_rows = !errors.has_value() above.
void check_errors(const std::optional<at::Tensor>& errors, int64_t n);

// The arguments as kernels read them (pointers into s's tensors, which must outlive the view).
SamplingView sampling_view(const SamplingArgs& s);

}  // namespace xkernels
