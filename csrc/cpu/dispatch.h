// Element-type dispatch of the CPU kernels.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

namespace xkernels::cpu {

// Calls f with a value of the C++ type of a (checked) logits dtype.
template <typename F>
void dispatch_logits(at::ScalarType dtype, F&& f) {
  switch (dtype) {
    case at::kFloat: return f(float{});
    case at::kBFloat16: return f(c10::BFloat16{});
    case at::kHalf: return f(c10::Half{});
    default: TORCH_CHECK(false, "unsupported logits dtype ", dtype);
  }
}

}  // namespace xkernels::cpu
