// Vector math the CPU kernels share, written with GCC/Clang vector extensions so each caller's
// target (a target clone, or an AVX-512 kernel) lowers it to its own registers.
#pragma once

#include <cstdint>
#include <cstring>

namespace xkernels::cpu {

// The reductions over whole rows use 16 lanes (one AVX-512 register; two AVX2 ones), the rest 8.
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

// always_inline: a caller compiled for a wider target must get its own copy, not a call to one
// compiled for the baseline.
template <typename V = f32x8>
__attribute__((always_inline)) inline V splat(float x) {
  return V{} + x;
}

template <typename V>
__attribute__((always_inline)) inline V load(const float* p) {
  V x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}

// exp(x) for x <= 0 (Cephes' polynomial, about 1 ulp), branch-free on every lane; x below
// -126 ln 2 gives 0 instead of a denormal (a weight of 0, as in a float32 exp that underflows;
// a floor there would give ids far below the max a positive weight).
template <typename V, typename I = decltype(V{} < V{})>
__attribute__((always_inline)) inline V exp_nonpositive(V x) {
  const V lowest = splat<V>(-87.3365447f);  // the exponent arithmetic below needs n >= -126
  const I below = x < lowest;
  x = below ? lowest : x;
  const V round = splat<V>(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const V n = (x * 1.44269504088896341f + round) - round;
  const V r = x - n * 0.693359375f - n * -2.12194440e-4f;
  V p = splat<V>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return below ? splat<V>(0.0f) : p * scale;
}

}  // namespace xkernels::cpu
