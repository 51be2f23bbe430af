// Lets one header define math that the CPU and CUDA kernels both run.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define XK_HD __host__ __device__ __forceinline__
#else
#define XK_HD inline
#endif

namespace xkernels {

// Single-precision log and exp, the same function names on host and device
// (never the fast-math intrinsics, so CPU and CUDA agree to within an ulp).
XK_HD float log_f32(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}

XK_HD float exp_f32(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

XK_HD bool is_nan_f32(float x) { return x != x; }

XK_HD bool is_finite_f32(float x) { return x - x == 0.0f; }

constexpr float kNegInf = -__builtin_huge_valf();

}  // namespace xkernels
