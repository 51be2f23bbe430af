// The per-request sampling values the ops reject, as bits of one int32 word a request: the
// asynchronous error flag an engine passes (the sampling ops' `errors`) in place of the host
// checks, which would sync on CUDA. The bits name what the host checks would have raised for; the
// kernels still read each such value as off (SamplingView::row), so the flag changes no result.
// xkernels/errors.py (SamplingError) and xkernels/reference/param_errors.py state the same.
#pragma once

#include <cstdint>

#include "xkernels/host_device.h"
#include "xkernels/sampling_params.h"

namespace xkernels {

enum ParamError : int32_t {
  kBadTemperature = 1,  // NaN, +-inf or negative (read as greedy)
  kBadTopK = 2,         // negative (read as off)
  kBadTopP = 4,         // NaN or outside (0, 1] (read as off)
  kBadMinP = 8,         // NaN or outside [0, 1] (read as off)
};

// Row n's bits, from the per-row tensors only: the scalars are checked on the host, which needs no
// sync. The comparisons are written so that NaN fails each range, as SamplingView::row's do.
XK_HD int32_t row_param_errors(const SamplingView& s, int64_t n) {
  int32_t bits = 0;
  if (s.temperature && !(s.temperature[n] >= 0.0f && is_finite_f32(s.temperature[n]))) bits |= kBadTemperature;
  if (s.top_k && s.top_k[n] < 0) bits |= kBadTopK;
  if (s.top_p && !(s.top_p[n] > 0.0f && s.top_p[n] <= 1.0f)) bits |= kBadTopP;
  if (s.min_p && !(s.min_p[n] >= 0.0f && s.min_p[n] <= 1.0f)) bits |= kBadMinP;
  return bits;
}

// Every row's bits OR-ed into errors[0, n): the CPU bindings' flag (the CUDA bindings launch
// param_errors_kernel, csrc/cuda/param_errors_launch.h; chain_verify_ragged_'s kernels flag
// their own rows).
inline void or_param_errors(const SamplingView& s, int64_t n, int32_t* errors) {
  for (int64_t row = 0; row < n; ++row) errors[row] |= row_param_errors(s, row);
}

}  // namespace xkernels
