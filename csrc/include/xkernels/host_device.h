// Lets one header define math that the CPU and CUDA kernels both run.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

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

// The float whose bit pattern is `bits`.
XK_HD float float_from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
#endif
}

// The bit pattern of x.
XK_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}

XK_HD bool is_nan_f32(float x) { return x != x; }

// The larger of a and b, a NaN counting as missing (fmaxf): one instruction on CUDA.
XK_HD float max_ignoring_nan(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  return b > a || a != a ? b : a;
#endif
}

XK_HD bool is_finite_f32(float x) { return x - x == 0.0f; }

constexpr float kNegInf = -__builtin_huge_valf();

constexpr float kLog2e = 1.4426950408889634f;

}  // namespace xkernels
